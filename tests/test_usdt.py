"""kvprof/collect/usdt.py against another tracer on the same binary: BCC 0.26's
own USDT attach gives the kernel another semaphore offset for a probe site than
kvprof's (the kernel keeps one per site and file), so kvprof cannot attach
there while it holds on; it says so in one line, and leaves nothing raised."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support import semaphores

from kvprof.collect import CollectError, CollectOptions
from kvprof.system.servers import Server


@pytest.mark.bpf
def test_another_tracer_on_the_same_site_is_named(kvcached_factory: Callable[..., Server]) -> None:
    from bcc import BPF, USDT

    from kvprof.collect.requests import RequestsCollector

    theirs, ours = kvcached_factory("-t", "1"), kvcached_factory("-t", "1")
    usdt = USDT(pid=theirs.pid)
    usdt.enable_probe(probe="kvs:cmd__done", fn_name="on_done")
    bpf = BPF(text=b"int on_done(struct pt_regs *ctx) { return 0; }", usdt_contexts=[usdt])
    try:
        with pytest.raises(CollectError) as caught:
            RequestsCollector(ours.pid, CollectOptions()).start()
    finally:
        bpf.cleanup()
        del usdt, bpf
    said = str(caught.value)
    assert "\n" not in said and "another tracer" in said and "detach it first" in said, said
    assert not any(semaphores(ours).values())
