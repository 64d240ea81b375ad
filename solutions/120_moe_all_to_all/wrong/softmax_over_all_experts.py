"""Takes the softmax over all E logits, then keeps the top-k probabilities: the weights do not sum to 1."""
import torch

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_output_matches_single_device"


class SoftmaxAll(ref.MoE):
    def route(self, x, router_w, top_k):
        return torch.softmax(x @ router_w, dim=-1).topk(top_k, dim=-1)


moe_forward = SoftmaxAll()
