pytest_plugins = ["kit.plugin"]
