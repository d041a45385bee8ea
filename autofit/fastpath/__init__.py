"""The fast path: a simulated search's unit of work, a scan of structures that share a pass.

A real probe answers one configuration at one batch (autofit/probe/). A simulated search asks
more of each trace: every batch of a structure (every knob but the batch size) from three traces
that lie on one line, and every structure of a group that differs only in its update from the
first one's forward and backward pass. docs/fast-path.md says it once; the modules, in the order
a search meets them:

- `grouping`: which combinations of a wave are scanned together (they share what a sample adds);
- `scheduler`: the order the search's threads take groups in, and the setups and updates shared;
- `scans`: the parent side, one subprocess per group, a `ScanResult` per structure however it ends;
- `scan`: the child side, `python -m autofit.fastpath.scan REQUEST RESULT`;
- `batch_curve`: every batch of one structure from three traces (record, check, replay);
- `first_step`: two steps' log from one pass, and one pass for structures that differ in update;
- `shared_updates`, `update_keys`: a configuration's setup and updates, traced once per search.

Its edge is the probe's contract: each structure goes in as a `ProbeSpec` and every point it
reports comes out as the `ProbeResult` a probe of that batch would give (autofit/records/probe.py).
"""
