"""Uses group ranks as the peers of isend/irecv: (r + 1) mod N is a rank of the group, not a global rank.

On the default group the two are the same; on a group of some of the ranks the messages go to the wrong
processes (or to ranks outside the group, which torch refuses).
"""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_runs_on_a_process_group"


class GroupRanks(ref.Ring):
    def global_rank(self, group_rank):
        return group_rank


class GroupRanksAsPeers(ref.CollectiveMatmul):
    def ring(self, group):
        return GroupRanks(group)


def all_gather_matmul(x, w, group=None):
    return ref._AllGatherMatmul.apply(x, w, group, GroupRanksAsPeers())


def matmul_reduce_scatter(x, w, group=None):
    return ref._MatmulReduceScatter.apply(x, w, group, GroupRanksAsPeers())
