import pytest

import hetmem

from conftest import MiB, PAGE


@pytest.fixture
def managed(ctx):
    try:
        m = ctx.alloc_managed(3 * MiB)
    except hetmem.UnsupportedFeatureError as e:  # pragma: no cover - no userfaultfd here
        pytest.skip(f"SKIP: managed memory unavailable on this machine: {e}")
    except hetmem.AclError as e:  # pragma: no cover
        if e.code == 207000:
            pytest.skip(f"SKIP: managed memory unavailable on this machine: {e}")
        raise
    yield m
    if m.alive:
        m.free()


def test_managed_is_rounded_and_host_reachable(ctx, np, managed, runtime):
    assert managed.size == 4 * MiB and managed.ptr % PAGE == 0
    assert ctx.is_managed(managed.ptr + 5) and not ctx.is_managed(ctx.alloc_host(4096))
    a = np.asarray(managed)
    a[:] = 1  # host faults populate every page
    assert int(a.sum()) == 4 * MiB
    assert runtime.driver.managed_stats()["host_faults"] >= 2
    assert managed.residency(0)["host"]


def test_advice_prefetch_and_the_eight_attributes(ctx, np, managed):
    attrs = managed.attributes()
    assert set(attrs) == {
        "read_mostly", "preferred_location", "accessed_by", "preferred_location_type",
        "preferred_location_id", "last_prefetch_location", "last_prefetch_location_type",
        "last_prefetch_location_id",
    }
    assert attrs["read_mostly"] == 0
    assert attrs["last_prefetch_location"] == -2
    managed.advise(hetmem.Advice.SET_PREFERRED_LOCATION, hetmem.Location.device(1))
    managed.advise(hetmem.Advice.SET_ACCESSED_BY, "host", offset=0, size=PAGE)
    with ctx.create_stream(1) as s:
        managed.prefetch(1, s, offset=PAGE, size=PAGE)
        s.synchronize()
    assert managed.attribute(hetmem.RangeAttribute.PREFERRED_LOCATION) == 1
    assert managed.attribute(hetmem.RangeAttribute.PREFERRED_LOCATION_TYPE) == 1  # DEVICE
    assert managed.attribute(hetmem.RangeAttribute.ACCESSED_BY, size=PAGE, slots=3) == [-1, -2, -2]
    assert managed.attribute(hetmem.RangeAttribute.ACCESSED_BY, slots=2) == [-2, -2]
    second = managed.attributes(offset=PAGE, size=PAGE)
    assert second["last_prefetch_location"] == 1
    assert second["last_prefetch_location_type"] == 1
    assert second["last_prefetch_location_id"] == 1
    assert managed.residency(PAGE)["devices"] == [1]
    managed.advise(hetmem.Advice.SET_READ_MOSTLY)
    assert managed.attribute(hetmem.RangeAttribute.READ_MOSTLY) == 1
    # the host reads the bytes wherever they are
    managed.write(b"\x11" * 16, PAGE)
    assert managed.read(PAGE, 16) == b"\x11" * 16


def test_stream_copies_and_fills(ctx, managed):
    host = ctx.alloc_host(4096)
    with ctx.create_stream(0) as s:
        s.memset_async(managed, 0x5A, 4096)
        s.memcpy_async(host, managed, 4096)
        s.synchronize()
        assert s.device == 0
    assert host.read(0, 8) == b"\x5a" * 8


def test_managed_errors_carry_acl_codes(ctx, managed):
    with pytest.raises(hetmem.AclError) as e:
        ctx.alloc_managed(0)
    assert e.value.code == 100000 and e.value.name == "ACL_ERROR_INVALID_PARAM"
    with pytest.raises(hetmem.AclError) as e:
        ctx.alloc_managed(PAGE, flag=2)
    assert e.value.code == 100000
    with pytest.raises(hetmem.AclError) as e:
        managed.advise(hetmem.Advice.SET_READ_MOSTLY, size=MiB)
    assert e.value.code == 107000 and "ACL_ERROR_RT_PARAM_INVALID" in str(e.value)
    with pytest.raises(hetmem.AclError) as e:
        managed.advise(hetmem.Advice.SET_READ_MOSTLY, offset=MiB, size=PAGE)
    assert e.value.code == 107008
    with pytest.raises(hetmem.AclError) as e:
        managed.attribute(99)
    assert e.value.code == 107000 and "99" in e.value.message
    with pytest.raises(hetmem.AclError) as e:
        managed.advise(7)
    assert e.value.code == 107000
    with pytest.raises(hetmem.AclError) as e:
        managed.advise(hetmem.Advice.SET_PREFERRED_LOCATION, 9)  # no device 9
    assert e.value.code == 107000
    with pytest.raises(hetmem.AclError):
        hetmem.Location(9, 0)
    managed.free()
    with pytest.raises(ValueError, match="freed"):
        managed.advise(hetmem.Advice.SET_READ_MOSTLY)
