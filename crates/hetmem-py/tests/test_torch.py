"""hetmem.torch on a GPU: a model under hetmem's allocator, sleep / wake at the same addresses,
a CUDA graph replayed after wake, the growable tensor, and a second process reading shared
weights. Skipped (with the reason) where torch or a CUDA device is missing; run on a GPU
machine by scripts/py-gpu."""

import multiprocessing as mp

import pytest

torch = pytest.importorskip("torch", reason="SKIP (torch): torch is not installed here")
if not torch.cuda.is_available():
    pytest.skip("SKIP (torch): no CUDA device", allow_module_level=True)

import hetmem  # noqa: E402
import hetmem.torch as ht  # noqa: E402

MiB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def cuda_allocator():
    assert ht.init("cuda") == "cuda"
    torch.cuda.init()
    yield


def make_model(seed, width=1024, depth=4):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    layers.append(torch.nn.LayerNorm(width))
    return torch.nn.Sequential(*layers)


def test_model_gives_the_same_outputs_under_hetmem():
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(64, 1024, device="cuda", generator=g)
    ref_model = make_model(0).cuda()
    with torch.no_grad():
        ref = ref_model(x)
    with ht.region("model"):
        model = make_model(0).cuda()
        with torch.no_grad():
            out = model(x)
    assert all(ht.owns(p) for p in model.parameters())
    assert not any(ht.owns(p) for p in ref_model.parameters())
    assert ht.owns(out)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert ht.last_error() is None or "does not exist" not in ht.last_error()


@pytest.mark.parametrize("offload", [True, False])
def test_sleep_and_wake_keep_data_ptr_and_contents(offload):
    tag = f"sleep-{offload}"
    with ht.region(tag):
        ts = [torch.randn(1 << 20, device="cuda") for _ in range(8)]  # 4 MiB each
    ptrs = [t.data_ptr() for t in ts]
    ref = [t.clone() for t in ts]
    torch.cuda.synchronize()
    free_awake = torch.cuda.mem_get_info()[0]
    blocks, nbytes = ht.sleep(tag, offload=offload)
    assert blocks >= 1 and nbytes >= 32 * MiB
    assert torch.cuda.mem_get_info()[0] >= free_awake + 32 * MiB  # really released
    assert all(b[4] for b in ht.blocks(tag))
    ht.wake(tag)
    assert [t.data_ptr() for t in ts] == ptrs
    if offload:
        for t, r in zip(ts, ref):
            assert torch.equal(t, r)
    for t in ts:  # writable again either way
        t.fill_(1.5)
    torch.cuda.synchronize()
    assert all(float(t.sum()) == 1.5 * t.numel() for t in ts)


def test_cuda_graph_replays_after_wake():
    with ht.region("graph"):
        w = torch.randn(256, 256, device="cuda")
        x = torch.randn(64, 256, device="cuda")
        y = torch.zeros(64, 256, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            torch.matmul(x, w, out=y)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.matmul(x, w, out=y)
    expect = x @ w
    ptrs = (w.data_ptr(), x.data_ptr(), y.data_ptr())
    ht.sleep("graph", offload=True)
    ht.wake("graph")
    assert (w.data_ptr(), x.data_ptr(), y.data_ptr()) == ptrs
    y.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, expect)
    x.mul_(2)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, expect * 2)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_growable_tensor_grows_in_a_loop(prefetch):
    step = MiB  # fp16 elements: 2 MiB
    g = ht.GrowableTensor(256 * step, dtype=torch.float16, chunk_bytes=32 * MiB, prefetch_chunks=prefetch)
    p = g.data_ptr()
    for i in range(128):
        g.grow(step)
        t = g.tensor
        t[-step:].fill_(i % 64)
        assert t.data_ptr() == p and t.numel() == (i + 1) * step
    torch.cuda.synchronize()
    rows = g.tensor.view(128, step)
    expect = (torch.arange(128, device="cuda") % 64).to(torch.float16)
    assert torch.equal(rows[:, 0], expect) and torch.equal(rows[:, -1], expect)
    assert g.mapped_bytes == 256 * MiB
    assert g.wait_prefetch() == prefetch  # made ahead by its thread (none without)
    g.shrink(64 * step)
    assert g.pool_chunks == 4 + prefetch and g.tensor.numel() == 64 * step
    g.grow(64 * step)  # from the pool
    assert g.pool_chunks == prefetch and g.data_ptr() == p
    assert torch.equal(g.tensor.view(128, step)[:64, 0], expect[:64])
    with pytest.raises(hetmem.UnsupportedSizeError):
        g.grow(1 << 30)


def _receiver(shared, q):
    import torch

    import hetmem.torch as ht

    ht.init("cuda")
    view, tensors = ht.open_shared(shared)
    q.put({k: float(v.double().sum()) for k, v in tensors.items()})
    del tensors
    torch.cuda.synchronize()


def test_a_second_process_reads_shared_weights():
    with ht.region("shared-weights"):
        model = make_model(3).cuda()
    weights = dict(model.state_dict())
    shared = ht.share(weights, "shared-weights")
    assert ht.context().driver.ipc_stats()["exports"] >= 1
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_receiver, args=(shared, q))
    p.start()
    try:
        got = q.get(timeout=300)
    finally:
        p.join(300)
    assert p.exitcode == 0
    ht.unshare(shared)
    assert set(got) == set(weights)
    for k, v in weights.items():
        assert got[k] == pytest.approx(float(v.double().sum()), rel=1e-9, abs=1e-9), k
