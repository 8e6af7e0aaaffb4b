"""``commdiag p2p``: every GPU pair, measured and checked (docs/p2p.md).

One command, all visible GPUs, no torchrun.  The parent process never touches CUDA or NVML:
it supervises probe processes (``probe.py``) that do, so a pair that hangs (the ACS symptom)
is killed with its process group, reported as hung, and the other pairs still run.

    result.py     the result dataclasses and the versioned JSON envelope (format commdiag-p2p)
    ceiling.py    what a link can carry: PCIe generation x width, NVLink count x rate (pure)
    flags.py      the checks: criterion, evidence, what to do (pure)
    assemble.py   probe records + job statuses -> the result (pure)
    render.py     the text matrices (100 columns for 8 GPUs)
    page.py       the HTML page with heatmaps, in the report's style
    supervise.py  probe processes under per-job deadlines; kill, restart, Ctrl-C
    probe.py      the child process: one job at a time (a GPU's host link, a pair), records out
    copies.py     the timed copies (torch for memory, streams and events; the driver's cuMemcpyAsync)
    run.py        the library entry: measure() -> P2PResult, load() a saved result
"""
