"""Computes the load-balancing loss from this rank's tokens only: f_e and P_e of the local batch, no all_reduce.
Each rank gets another number, none of them the global batch's loss."""
import torch

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_aux_loss_matches_single_device"


class Local(ref.MoE):
    def aux_loss(self, x, router_w, experts, group):
        n_experts, (tokens, top_k) = router_w.shape[1], experts.shape
        if tokens == 0:
            return x.new_zeros(())
        probs = torch.softmax(x @ router_w, dim=-1)
        f = torch.bincount(experts.reshape(-1), minlength=n_experts).to(probs.dtype) / (tokens * top_k)
        return n_experts * (f * probs.mean(0)).sum()


moe_forward = Local()
