"""Problem 119 placeholder: being written."""


def ring_attention(*args, **kwargs):
    raise NotImplementedError('ring_attention: see README.md')
