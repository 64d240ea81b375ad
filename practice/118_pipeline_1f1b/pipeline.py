"""Problem 118 placeholder: being written."""


def schedule_1f1b(*args, **kwargs):
    raise NotImplementedError('schedule_1f1b: see README.md')


def schedule_gpipe(*args, **kwargs):
    raise NotImplementedError('schedule_gpipe: see README.md')


def simulate(*args, **kwargs):
    raise NotImplementedError('simulate: see README.md')


def SimResult(*args, **kwargs):
    raise NotImplementedError('SimResult: see README.md')


def ScheduleDeadlock(*args, **kwargs):
    raise NotImplementedError('ScheduleDeadlock: see README.md')


def run_pipeline(*args, **kwargs):
    raise NotImplementedError('run_pipeline: see README.md')
