"""Model leases against a real mxserved: a leased model that its client keeps
using stays, one left alone is deleted (a crashed trainer leaves nothing behind),
an unleased one stays, and bad lease values name the field."""

import time

import grpc
import numpy as np
import pytest

import mxserve


def layer(name="fc"):
    return [mxserve.LayerSpec(name, 16, 32, False)]


def names(client):
    return {m.name for m in client.list_models()}  # listing does not renew a lease


def test_a_used_lease_is_renewed_and_an_idle_one_expires(client):
    info = client.register_model("lease-used", layer(), lease_seconds=2.0)
    assert info.lease_seconds == 2.0
    client.register_model("lease-idle", layer(), lease_seconds=2.0)
    client.register_model("lease-none", layer())
    w = np.ones((16, 32), dtype=np.float32)
    client.upload_weights("lease-used", {"fc": w}, publish=True)
    x = np.ones((2, 32), dtype=np.float32)
    # Two leases of steady use: it stays.
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        client.forward("lease-used", "fc", x, phase="rollout")
        time.sleep(0.2)
    have = names(client)
    assert "lease-used" in have and "lease-none" in have
    assert "lease-idle" not in have
    # Left alone, it goes too (the daemon checks four times a second).
    time.sleep(2.8)
    have = names(client)
    assert "lease-used" not in have and "lease-none" in have
    with pytest.raises(mxserve.MxserveError) as error:
        client.forward("lease-used", "fc", x, phase="rollout")
    assert error.value.code == grpc.StatusCode.NOT_FOUND
    # Its name is free again.
    client.register_model("lease-used", layer())
    client.delete_model("lease-used")
    client.delete_model("lease-none")


@pytest.mark.parametrize("bad", [-1.0, 0.25, 2592000.5, float("nan"), float("inf")])
def test_lease_seconds_out_of_range_is_invalid_argument(client, bad):
    with pytest.raises(mxserve.MxserveError) as error:
        client.register_model("lease-bad", layer(), lease_seconds=bad)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "lease_seconds: expected 0 (no lease) or 1 to 2592000, got" in str(error.value)
    assert "lease-bad" not in names(client)
