"""no_sync() switches sync back on when it exits, instead of restoring the previous setting: nesting breaks."""
import contextlib

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_nested_no_sync"


class AccumulatingDDP(ref.AccumulatingDDP):
    @contextlib.contextmanager
    def no_sync(self):
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = True
