"""Fixtures: a host-backend runtime with two small devices (the suite needs no GPU)."""

import pytest

import hetmem

MiB = 1 << 20
PAGE = 2 * MiB


@pytest.fixture(scope="session")
def runtime():
    return hetmem.Runtime("host", host_devices=2, host_device_memory="256M")


@pytest.fixture
def ctx(runtime):
    return runtime.create_context()


@pytest.fixture
def np():
    return pytest.importorskip("numpy")
