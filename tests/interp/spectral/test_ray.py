"""``--executor ray`` on a real local Ray (2 CPUs): the same rows as the local thread pool.

Skips when Ray is not installed (it is the optional extra ``lenslab[ray]``).
"""

from __future__ import annotations

import pytest
from spectral_helpers import SPIKES, same_result

from lenslab.interp.spectral import traps_command

ray = pytest.importorskip("ray", reason="Ray not installed (pip install 'lenslab[ray]')")


@pytest.fixture
def local_ray(monkeypatch):
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")  # no usage report (no network at run time)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_ray_matches_local(shard_folder, local_ray):
    folder, _ = shard_folder
    local = traps_command(folder, workers=2, progress=False)
    remote = traps_command(folder, workers=2, executor="ray", progress=False)
    assert local_ray.is_initialized()  # the scan used the cluster we started, not a new one
    assert same_result(remote, local)
    rows = {r["name"]: r for r in remote["checkpoints"][0]["matrices"]}
    assert {n: rows[n]["n_traps"] for n in SPIKES} == {n: len(s) for n, s in SPIKES.items()}  # the planted traps
    assert "NaN/inf" in rows["broken.weight"]["error"]  # error rows travel back from the workers too
    assert remote["checkpoints"][0]["skipped"] == local["checkpoints"][0]["skipped"]
    ww_local = traps_command(folder, mode="weightwatcher", progress=False)
    ww_remote = traps_command(folder, mode="weightwatcher", executor="ray", progress=False)
    assert same_result(ww_remote, ww_local)
