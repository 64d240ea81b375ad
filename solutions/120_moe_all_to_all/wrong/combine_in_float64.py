"""Runs the experts in float64 for accuracy and sends their outputs back in float64: in float32 the combine moves twice the bytes."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_dispatch_sends_each_token_choice_once"


class CombineInFloat64(ref.MoE):
    def run_experts(self, incoming, recv_counts, w1, w2):
        return super().run_experts(incoming.double(), recv_counts, w1.double(), w2.double())

    def combine(self, returned, order, weights, tokens, top_k, d):
        return super().combine(returned.to(weights.dtype), order, weights, tokens, top_k, d)


moe_forward = CombineInFloat64()
