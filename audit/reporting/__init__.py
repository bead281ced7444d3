"""The party's privacy report: one folder per audited round and the summaries across rounds.

- atomic_io: every file is written atomically (a crash leaves the earlier rounds intact);
- records: reading per-round records back; party: the collaborator's report writer (validation, plots, pages);
- verdicts, headline: what a round came to, in words and as the pictures' headline; readings: values off records;
- plots (ROC, per-round lines, histograms), overview_plots (the run index's grid, the party's headline chart);
- page_parts (the shared page), party_page (a party's page), html (the run index).
A new report view (a plot or table from the round records) goes in `party`'s page and summary rebuild.
"""
