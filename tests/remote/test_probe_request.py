"""The probe's options are one typed ProbeRequest (agent/probe/request.py, issue 25): what the laptop sends is what
the probe reads, field for field, for any request; anything else is refused with one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from harness.agentpyz import archive_path
from hypothesis import given
from hypothesis import strategies as st

from dflashctl.agent.probe.request import DEFAULT_LOG_MAX, ProbeRequest
from dflashctl.remote.probe import one_shot

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
maybe_int = st.none() | st.integers(min_value=0, max_value=2 ** 63)
requests = st.builds(
    ProbeRequest, workspace=st.none() | text, run=st.none() | text, log_offset=maybe_int, log_inode=maybe_int,
    log_max=st.integers(min_value=0, max_value=2 ** 40), procs=st.booleans(),
    pids=st.lists(st.integers(min_value=1, max_value=2 ** 22), max_size=3).map(tuple), gpus=st.booleans(),
    events=st.booleans(), runs=st.booleans(), host_gpu_procs=st.none() | text, xid=st.booleans(),
    watch=st.booleans(), interval=st.floats(min_value=0.01, max_value=3600, allow_nan=False),
    gpu_interval=st.none() | st.floats(min_value=0.01, max_value=3600, allow_nan=False))


@given(requests)
def test_every_request_reads_back_as_itself(req: ProbeRequest):
    assert ProbeRequest.from_argv(req.to_argv()) == req


def test_the_defaults_send_nothing_and_flags_send_no_value():
    assert ProbeRequest().to_argv() == []
    assert ProbeRequest(gpus=True, pids=(7, 9), log_max=DEFAULT_LOG_MAX, run="latest").to_argv() == \
        ["--run", "latest", "--pids", "7", "--pids", "9", "--gpus"]


def test_a_value_that_looks_like_an_option_stays_a_value():
    req = ProbeRequest(workspace="--gpus", run="-")
    assert ProbeRequest.from_argv(req.to_argv()) == req


@pytest.mark.parametrize(("argv", "why"), [
    (["--bogus"], "unknown argument '--bogus'"),
    (["gpus"], "unknown argument 'gpus'"),
    (["--run"], "--run needs a value"),
    (["--log-max", "lots"], "--log-max 'lots' is not an integer"),
    (["--interval", "soon"], "--interval 'soon' is not a number"),
])
def test_an_argument_it_cannot_read_is_refused_naming_it(argv: list[str], why: str):
    with pytest.raises(ValueError, match=why.replace("(", r"\(")):
        ProbeRequest.from_argv(argv)


def test_the_probe_program_refuses_a_bad_argument_with_one_line_and_exit_2():
    res = subprocess.run([sys.executable, archive_path(), "probe", "--log-max", "lots"], capture_output=True,
                         timeout=60)
    assert res.returncode == 2 and res.stderr.decode().strip() == "probe: --log-max 'lots' is not an integer"


def test_the_laptops_keywords_make_the_request_the_probe_reads():
    req = one_shot("/ws", "latest", 12, procs=True, gpus=False, pids=(5,), events=True, log_inode=3)
    assert req == ProbeRequest(workspace="/ws", run="latest", log_offset=12, log_inode=3, procs=True, pids=(5,),
                               events=True)
    assert ProbeRequest.from_argv(req.to_argv()) == req
