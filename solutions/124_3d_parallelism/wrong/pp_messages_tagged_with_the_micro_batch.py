"""Tags every message between pipeline stages with its micro-batch's number (one more element), to check on
arrival that the schedule delivers them in order: right values, but more pp bytes than the activations need."""
import torch
import torch.distributed as dist

import harness
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_bytes_per_step"


class Parallel3D(ref.Parallel3D):
    def _pipeline(self, xs, ys):
        like, saved, posted, total = xs[0], {}, [], 0.0

        def receive(peer, i):
            buffer = torch.empty(like.numel() + 1, dtype=like.dtype, device=harness.device())
            dist.irecv(buffer, peer).wait()
            assert int(buffer[-1]) == i, f"micro-batch {int(buffer[-1])} arrived where {i} was due"
            return buffer[:-1].view(like.shape).clone()

        def post(tensor, peer, i):
            tagged = torch.cat([tensor.detach().reshape(-1), torch.tensor([float(i)], dtype=tensor.dtype,
                                                                           device=tensor.device)])
            posted.append((tagged, dist.isend(tagged, peer)))

        for kind, i in ref._one_f_one_b(self.m, min(self.pp - self.groups.pp_rank - 1, self.m)):
            if kind == "F":
                x = xs[i] if self.prev is None else receive(self.prev, i).requires_grad_()
                out = self(x)
                if self.next is None:
                    out = self._loss(out, ys[i])
                    total += out.item()
                else:
                    post(out, self.next, i)
                saved[i] = (x, out)
                continue
            x, out = saved.pop(i)
            out.backward(None if self.next is None else receive(self.next, i))
            if self.prev is not None:
                post(x.grad, self.prev, i)
        for _, work in posted:
            work.wait()
        return total if self.next is None else None
