"""Problem 114 placeholder: being written."""


def AccumulatingDDP(*args, **kwargs):
    raise NotImplementedError('AccumulatingDDP: see README.md')


def train_step(*args, **kwargs):
    raise NotImplementedError('train_step: see README.md')
