"""no_sync() restores the setting after a normal exit only; an exception leaves sync switched off for good."""
import contextlib

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_state_restored_after_exception"


class AccumulatingDDP(ref.AccumulatingDDP):
    @contextlib.contextmanager
    def no_sync(self):
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        yield
        self.require_backward_grad_sync = previous
