"""Takes f_e from the pairs it dispatched (the counts after dropping) instead of every top-k choice: with a small
capacity factor the overloaded experts look less loaded than they are."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_aux_loss_matches_single_device"


class KeptCounts(ref.MoE):
    def __call__(self, x, router_w, w1, w2, top_k, group=None, capacity_factor=None, return_stats=False):
        self.capacity_factor = capacity_factor
        return super().__call__(x, router_w, w1, w2, top_k, group, capacity_factor, return_stats)

    def aux_loss(self, x, router_w, experts, group):
        n_experts, (tokens, top_k) = router_w.shape[1], experts.shape
        probs = torch.softmax(x @ router_w, dim=-1)
        mine = probs.sum(0)
        sent = experts.reshape(-1)[self.kept(experts, n_experts, self.capacity_factor)]
        stats = torch.cat([torch.bincount(sent, minlength=n_experts).to(mine.dtype), mine.detach(),
                           mine.new_tensor([tokens])])
        dist.all_reduce(stats, group=group)
        counts, prob_sums, total = stats[:n_experts], stats[n_experts:-1] + (mine - mine.detach()), float(stats[-1])
        if total == 0:
            return x.new_zeros(())
        return n_experts * (counts / (total * top_k) * prob_sums / total).sum()


moe_forward = KeptCounts()
