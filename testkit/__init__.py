"""Helpers that problem tests share: models and data, hypothesis strategies, process groups, flat shards.

    testkit.models       seeded MLPs and batches, OptimizerSpec, single-process reference training
    testkit.strategies   hypothesis strategies that lean towards the cases that expose classic bugs
    testkit.groups       member_group / contiguous_groups: process groups inside a rank function
    testkit.flat_shards  the flat, padded ZeRO / FSDP partition and the costs that follow from it
    testkit.siblings     import_siblings, import_oracles: a problem's own helper modules (beside its tests, or its
                         oracles under tests/oracles/), by name, here and on the ranks
    testkit.overlap      check_receives_overlap_compute: each receive waited on only after compute ran
    testkit.resident     resident_growth: what a call left alive, from the kernel's count of the rank's memory
    testkit.cost         record: a test's cost figures (the model's value, yours) for the judge's cost table
    testkit.schedule_strategies, testkit.pipelines, testkit.schedule_drawing, testkit.pipeline_runs
                         pipeline schedules (118, 122, 130): strategies, replaying a schedule against its rules,
                         drawing it, running it on real ranks against single-process training
    testkit.attention_shards   forward_backward, chunk_of: attention on sequence shards (119, 128)

This is the layer between the engine and the problems: it imports only the engine's
public API (``harness.<name>``, the names ``harness/__init__.py`` exports), never one of
the engine's own modules or the judge app (``kit``).  A helper that serves one problem
lives beside that problem's tests instead (``practice/117_tensor_parallel/shard_match.py``,
``practice/118_pipeline_1f1b/pipeline_grid.py``).
"""
