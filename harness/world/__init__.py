"""A world and its wire: N rank processes forked from the forkserver, fed calls, their replies and records read.

``boot`` starts the forkserver and the ranks; ``rank`` is the loop each rank runs; ``world`` runs one
call on every rank and turns what went wrong into a report (``diagnose``); ``wire`` is the format
of what travels (plain data back from the ranks); ``records`` reads the op records they stream.
"""
