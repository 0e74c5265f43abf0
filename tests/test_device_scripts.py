"""The device scripts in bench/ (run on the lent GPU machine) parse, and the environment they all source
(bench/device_env.sh) sets what they use: out (created), gpu, day, clocks, PYTHONPATH and headless."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(BENCH.glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_device_script_parses(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_the_scripts_that_name_files_source_the_shared_environment():
    for script in SCRIPTS:
        text = script.read_text()
        if script.name != "device_env.sh" and ("$gpu" in text or "$day" in text or "clocks" in text):
            assert 'source "$(dirname "$0")/device_env.sh"' in text, script.name


def test_device_env_sets_what_the_scripts_use(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\ncase "$*" in *clocks_event*) echo "1980 MHz, 0x0, 31, 120 W";; '
        '*) echo "NVIDIA H200";; esac\n'
    )
    smi.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "OUT": str(out)}
    shown = subprocess.run(
        [
            "bash",
            "-c",
            f'source "{BENCH / "device_env.sh"}"; '
            'echo "$out|$gpu|$day|$NBODY_HEADLESS|${PYTHONPATH%%:*}"; clocks',
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=BENCH.parent,
        check=True,
    ).stdout
    first, clocks = shown.splitlines()
    where, gpu, day, headless, path = first.split("|")
    assert (where, gpu, headless, path) == (str(out), "h200", "1", str(BENCH.parent)) and out.is_dir()
    assert len(day) == 10 and day[4] == day[7] == "-"
    assert clocks.startswith("1980 MHz")
