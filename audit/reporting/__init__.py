"""The party's privacy report: one folder per audited round and the summaries across rounds.

- atomic_io: every file is written atomically (a crash leaves the earlier rounds intact);
- round_files: reading per-round records back; party: the collaborator's report (validation, plots, HTML, writer).
A new report view (a plot or table from the round records) goes in `party`'s page and summary rebuild.
"""
