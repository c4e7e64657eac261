"""The package in an MPI job: mpi4py ranks under mpirun find each other by
`rank:N` through the launcher's PMIx store."""

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def test_mpirun_two_ranks_with_mpi4py_and_pmix():
    pytest.importorskip("mpi4py")
    mpirun = os.environ.get("FERRY_MPIRUN") or shutil.which("mpirun")
    if not mpirun:
        pytest.skip("mpirun is not installed")
    module_dir = os.environ.get("FERRY_MODULE_DIR", "")
    if module_dir and not os.path.exists(os.path.join(module_dir, "ferry_pmix.so")):
        pytest.skip("the pmix module is not built (libpmix-dev missing)")
    env = dict(os.environ)
    for name in ("PMIX_NAMESPACE", "PMIX_RANK", "FERRY_METADATA", "FERRY_SEGMENT_NAME"):
        env.pop(name, None)
    env["FERRY_RPC_ADDRESS"] = "127.0.0.1"  # descriptors carry loopback addresses: one host
    # root needs --allow-run-as-root; 2 cores need --oversubscribe
    command = ["timeout", "-k", "5", "240", mpirun, "--allow-run-as-root", "--oversubscribe",
               "--bind-to", "none", "-np", "2", sys.executable, os.path.join(HERE, "mpi_job.py")]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=260)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for rank in range(2):
        assert output.count(f"rank {rank}: OK") == 1, output
