"""hvdrun: the exact mpirun commands it builds, real runs at 2 and 3 ranks, bad arguments."""
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

ROOT = ["--allow-run-as-root"] if os.geteuid() == 0 else []
AGENT = "%s -m horovod_cpp.runner.ssh_agent" % os.path.normpath(sys.executable)
HVDRUN = [sys.executable, "-m", "horovod_cpp.runner"]


def hvdrun(args, env=None, timeout=120):
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    for name in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "LANG"):
        if name in os.environ:
            base[name] = os.environ[name]
    base.update(env or {})
    return subprocess.run(HVDRUN + args, capture_output=True, text=True, env=base,
                          timeout=timeout)


def forwarded(*extra):
    """The -x NAME arguments hvdrun adds for hvdrun()'s environment plus ``extra`` names: every
    variable but HOME and Open MPI's own OMPI_* (sorted)."""
    names = sorted({"PATH", *extra} | ({"LANG"} if "LANG" in os.environ else set()))
    return [a for n in names for a in ("-x", n)]


def printed_command(result):
    """The argv hvdrun printed (--verbose / --dry-run)."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("hvdrun: ")]
    assert lines, result.stderr
    argv = shlex.split(lines[0][len("hvdrun: "):])
    assert argv[0] == shutil.which("mpirun")  # the one that runs, found on PATH
    return ["mpirun"] + argv[1:]


# ---- the exact mpirun command ------------------------------------------------------------------

CPUS = len(os.sched_getaffinity(0))


def test_defaults_on_this_machine():
    r = hvdrun(["-np", "2", "--dry-run", "python", "train.py", "--epochs", "3"])
    assert r.returncode == 0, r.stderr
    assert printed_command(r) == (
        ["mpirun"] + ROOT + ["--tag-output", "-np", "2", "--bind-to", "none", "--map-by",
                             "slot", "-mca", "mpi_yield_when_idle", "1",
                             "-x", "OMP_NUM_THREADS=%d" % max(1, CPUS // 2)] + forwarded() + [
                             "python", "train.py", "--epochs", "3"])


def omp_setting(args, env=None):
    """The OMP_NUM_THREADS value hvdrun's --dry-run command sets (None: none set)."""
    r = hvdrun(args + ["--dry-run", "./t"], env=env)
    assert r.returncode == 0, r.stderr
    cmd = printed_command(r)
    values = [a.split("=", 1)[1] for a in cmd if a.startswith("OMP_NUM_THREADS=")]
    assert len(values) <= 1, cmd
    return int(values[0]) if values else None


def test_omp_threads_divide_the_cpus_among_a_hosts_ranks():
    # This machine alone: its CPUs shared out, never below 1.
    assert omp_setting(["-np", "2"]) == max(1, CPUS // 2)
    assert omp_setting(["-np", "3"]) == max(1, CPUS // 3)
    assert omp_setting(["-np", str(4 * CPUS)]) == 1
    assert omp_setting(["-np", "2", "-H", "localhost:2"]) == max(1, CPUS // 2)
    # One rank per host: torch's own default stays.
    assert omp_setting(["-np", "1"]) is None
    assert omp_setting(["-np", "2", "-H", "node1:1,node2:1"]) is None
    # Several ranks on some other host: 1, as torchrun (their CPUs are not known here).
    assert omp_setting(["-np", "3", "-H", "node1:2,node2:1"]) == 1
    assert omp_setting(["-np", "3", "-H", "node1:1,node2:1", "--oversubscribe"]) == 1
    # The user's own value wins, and is passed on by name.
    r = hvdrun(["-np", "2", "--dry-run", "./t"], env={"OMP_NUM_THREADS": "5"})
    cmd = printed_command(r)
    assert cmd[cmd.index("OMP_NUM_THREADS") - 1] == "-x"
    assert not any(a.startswith("OMP_NUM_THREADS=") for a in cmd)


def test_every_knob_hosts_and_mpi_args():
    r = hvdrun(["-np", "4", "-H", "node1:2,node2:2", "--fusion-threshold-mb", "32",
                "--cycle-time-ms", "0.5", "--cache-capacity", "0",
                "--timeline-filename", "/tmp/tl.json", "--timeline-mark-cycles",
                "--stall-check-time-seconds", "5", "--stall-shutdown-time-seconds", "20",
                "--log-level", "debug", "--mpi-args", "-mca btl tcp,self --report-bindings",
                "--dry-run", "./train", "--lr", "0.1"],
               env={"PYTHONPATH": "/opt/lib"})
    assert r.returncode == 0, r.stderr
    assert printed_command(r) == (
        ["mpirun"] + ROOT + [
            "--tag-output", "-np", "4", "-H", "node1:2,node2:2", "--bind-to", "none",
            "--map-by", "slot", "-mca", "mpi_yield_when_idle", "1",
            # other hosts: ssh with the remote daemon under a guard (runner/ssh_agent.py)
            "-mca", "plm_rsh_agent", AGENT + " --",
            "-x", "HOROVOD_CACHE_CAPACITY=0",
            "-x", "HOROVOD_CYCLE_TIME=0.5",
            "-x", "HOROVOD_FUSION_THRESHOLD=33554432",
            "-x", "HOROVOD_LOG_LEVEL=debug",
            "-x", "HOROVOD_STALL_CHECK_TIME_SECONDS=5.0",
            "-x", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=20.0",
            "-x", "HOROVOD_TIMELINE=/tmp/tl.json",
            "-x", "HOROVOD_TIMELINE_MARK_CYCLES=1",
            "-x", "OMP_NUM_THREADS=1",  # 2 ranks on a host elsewhere
        ] + forwarded("PYTHONPATH") + [
            "-mca", "btl", "tcp,self", "--report-bindings",
            "./train", "--lr", "0.1"])


def test_the_environment_reaches_the_ranks_but_host_and_session_variables():
    r = hvdrun(["-np", "2", "-H", "node1:1,node2:1", "--dry-run", "./t"],
               env={"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "3", "MY_SETTING": "x y",
                    "OMPI_MCA_btl_tcp_if_include": "eth0", "SSH_AUTH_SOCK": "/tmp/a",
                    "HOSTNAME": "login1", "CUDA_VISIBLE_DEVICES": "0", "PWD": "/somewhere",
                    "OMPI_COMM_WORLD_RANK": "3"})
    assert r.returncode == 0, r.stderr
    cmd = printed_command(r)
    names = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]
    assert names == [a for a in forwarded("NCCL_DEBUG", "OMP_NUM_THREADS", "MY_SETTING",
                                          "OMPI_MCA_btl_tcp_if_include") if a != "-x"]
    assert "x y" not in " ".join(cmd)  # values travel in the environment, not the command


def test_multi_host_flags():
    r = hvdrun(["-np", "2", "-H", "node1:1,node2:1", "--network-interface", "eth1,eth2",
                "-p", "2222", "-i", "keys/id", "--output-filename", "logs",
                "--prefix-output-with-timestamp", "--start-timeout", "7", "--dry-run", "./t"])
    assert r.returncode == 0, r.stderr
    cmd = printed_command(r)
    tail = cmd[cmd.index("-x"):]
    assert "NCCL_SOCKET_IFNAME=eth1,eth2" in tail
    options = cmd[cmd.index("--timestamp-output"):-1]
    assert options == ["--timestamp-output", "--output-filename", os.path.abspath("logs"),
                       "-mca", "btl_tcp_if_include", "eth1,eth2",
                       "-mca", "oob_tcp_if_include", "eth1,eth2"]
    # The ssh options go to the agent, before its "--".
    agent = cmd[cmd.index("plm_rsh_agent") + 1]
    assert agent == AGENT + " -p 2222 -i %s --" % os.path.abspath("keys/id"), cmd
    bad = hvdrun(["-np", "2", "--start-timeout", "0", "--dry-run", "./t"])
    assert bad.returncode == 2 and "--start-timeout must be positive" in bad.stderr


def test_user_choice_of_yield_when_idle_wins():
    r = hvdrun(["-np", "2", "--mpi-args", "--mca mpi_yield_when_idle 0", "--dry-run", "./t"])
    assert r.returncode == 0, r.stderr
    cmd = printed_command(r)
    assert cmd.count("mpi_yield_when_idle") == 1 and cmd[-4:] == ["--mca", "mpi_yield_when_idle",
                                                                 "0", "./t"]
    r = hvdrun(["-np", "2", "--dry-run", "./t"], env={"OMPI_MCA_mpi_yield_when_idle": "0"})
    assert r.returncode == 0, r.stderr
    assert "mpi_yield_when_idle" not in printed_command(r)


def test_hostfile_environment_knobs_and_relative_timeline(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two machines\nalpha slots=3\nbeta   # one slot\n")
    r = hvdrun(["-np", "4", "--hostfile", str(hostfile), "--timeline-filename", "t.json",
                "--dry-run", "python", "x.py"],
               env={"HOROVOD_FUSION_THRESHOLD": "1024", "HOROVOD_CYCLE_TIME": "2"})
    assert r.returncode == 0, r.stderr
    cmd = printed_command(r)
    assert cmd[cmd.index("-H") + 1] == "alpha:3,beta:1"
    # A flag sets a value; HOROVOD_* from the environment are passed on by name.
    assert "HOROVOD_TIMELINE=" + os.path.join(os.getcwd(), "t.json") in cmd
    assert cmd[cmd.index("HOROVOD_CYCLE_TIME") - 1] == "-x"
    assert "HOROVOD_FUSION_THRESHOLD" in cmd
    assert "--oversubscribe" not in cmd


def test_oversubscription_only_when_needed_or_asked():
    cores = os.cpu_count()
    r = hvdrun(["-np", str(cores), "--dry-run", "true"])
    assert "--oversubscribe" not in printed_command(r)
    r = hvdrun(["-np", str(cores + 1), "--dry-run", "true"])
    assert "--oversubscribe" in printed_command(r)
    r = hvdrun(["-np", "3", "-H", "a:1,b:1", "--oversubscribe", "--dry-run", "true"])
    assert r.returncode == 0 and "--oversubscribe" in printed_command(r)


def test_console_script_is_installed():
    script = os.path.join(os.path.dirname(sys.executable), "hvdrun")
    r = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for flag in ("-np", "--hostfile", "--fusion-threshold-mb", "--cycle-time-ms",
                 "--cache-capacity", "--timeline-filename", "--timeline-mark-cycles",
                 "--stall-check-time-seconds", "--stall-shutdown-time-seconds", "--log-level",
                 "--mpi-args", "--verbose"):
        assert flag in r.stdout


# ---- real runs -----------------------------------------------------------------------------------

PROGRAM = r"""
import os, sys
import torch
import horovod_cpp.torch as hvd
hvd.init()
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()
print("rank %d of %d sum %g threshold %s" % (hvd.rank(), hvd.size(), total,
      os.environ.get("HOROVOD_FUSION_THRESHOLD")))
print("to stderr from %d" % hvd.rank(), file=sys.stderr)
hvd.shutdown()
"""


@pytest.mark.parametrize("np", [2, 3])
def test_real_run_prefixes_output_and_forwards_knobs(np):
    r = hvdrun(["-np", str(np), "--verbose", "--fusion-threshold-mb", "1",
                sys.executable, "-c", PROGRAM])
    assert r.returncode == 0, r.stdout + r.stderr
    total = np * (np + 1) / 2
    for rank in range(np):
        assert ("[%d]<stdout>:rank %d of %d sum %g threshold 1048576" % (rank, rank, np, total)
                in r.stdout.splitlines()), r.stdout
        assert "[%d]<stderr>:to stderr from %d" % (rank, rank) in r.stderr.splitlines()
    assert re.search(r"^hvdrun: /\S*mpirun --", r.stderr, re.M), r.stderr  # --verbose


@pytest.mark.parametrize("launcher", [[], ["--gloo"]])
def test_ranks_get_the_omp_threads_and_hvdrun_says_so(launcher):
    code = "import os; print('threads', os.environ.get('OMP_NUM_THREADS'))"
    expected = max(1, CPUS // 2)
    r = hvdrun(launcher + ["-np", "2", sys.executable, "-c", code])
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(2):
        assert "[%d]<stdout>:threads %d" % (rank, expected) in r.stdout.splitlines(), r.stdout
    assert ("hvdrun: each rank runs with OMP_NUM_THREADS=%d (2 ranks share this machine's %d "
            "CPUs); set OMP_NUM_THREADS to choose" % (expected, CPUS)) in r.stderr, r.stderr
    r = hvdrun(launcher + ["-np", "2", sys.executable, "-c", code], env={"OMP_NUM_THREADS": "3"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[1]<stdout>:threads 3" in r.stdout.splitlines() and "OMP_NUM" not in r.stderr


CCL_PROGRAM = """
import torch
import horovod_cpp.torch as hvd
from horovod_cpp.torch import basics
hvd.init()
t = hvd.allreduce(torch.full((5,), float(hvd.rank() + 1)), op=hvd.Sum)
print("data plane %s controller %s sum %g" % (basics._core.host_backend(),
      "Gloo" if hvd.gloo_enabled() else "MPI" if hvd.mpi_enabled() else "?", t[0].item()))
"""


@pytest.mark.parametrize("launcher", [[], ["--gloo"]])
def test_cpu_operations_ccl_runs_the_collectives_on_oneccl(launcher):
    import horovod_cpp.torch as hvd
    if not hvd.ccl_built():
        pytest.skip("this build has no oneCCL")
    r = hvdrun(launcher + ["-np", "2", "--cpu-operations", "ccl", sys.executable, "-c",
                           CCL_PROGRAM])
    assert r.returncode == 0, r.stdout + r.stderr
    controller = "Gloo" if launcher else "MPI"
    for rank in range(2):
        assert ("[%d]<stdout>:data plane oneCCL controller %s sum 3" % (rank, controller)
                in r.stdout.splitlines()), r.stdout


def test_exit_code_of_the_job():
    code = "import os, sys; sys.exit(3 if os.environ['OMPI_COMM_WORLD_RANK'] == '1' else 0)"
    r = hvdrun(["-np", "2", sys.executable, "-c", code])
    assert r.returncode == 3, r.stdout + r.stderr
    assert "hvdrun: mpirun exited with exit code 3" in r.stderr


def test_a_rank_killed_by_a_signal():
    code = ("import os, signal, time\n"
            "if os.environ['OMPI_COMM_WORLD_RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n"
            "time.sleep(30)")
    r = hvdrun(["-np", "2", sys.executable, "-c", code])
    assert r.returncode == 128 + 9, r.stdout + r.stderr
    assert re.search(r"rank 1 exited with signal 9", r.stderr), r.stderr


def test_each_job_has_a_session_directory_of_its_own(tmp_path):
    from horovod_cpp.job import mpirun
    # Below OMPI_MCA_orte_tmpdir_base where set (made if missing), else below TMPDIR.
    base = tmp_path / "sessions" / "deeper"
    argv, path = mpirun.own_session_dir(["/usr/bin/mpirun", "-np", "2", "true"],
                                        {"OMPI_MCA_orte_tmpdir_base": str(base)})
    assert os.path.dirname(path) == str(base) and os.path.isdir(path)
    assert argv == ["/usr/bin/mpirun", "-mca", "orte_tmpdir_base", path, "-np", "2", "true"]
    # The user's own choice stands (Open MPI takes a local or remote base, or the global one).
    plain = ["mpirun", "-np", "2", "true"]
    chosen = ["mpirun", "-mca", "orte_tmpdir_base", "/scratch", "-np", "2", "true"]
    assert mpirun.own_session_dir(chosen, {}) == (chosen, None)
    hvdrun_argv = [sys.executable, "-m", "horovod_cpp.runner", "-np", "2", "true"]
    assert mpirun.own_session_dir(hvdrun_argv, {}) == (hvdrun_argv, None)  # it makes its own
    assert mpirun.own_session_dir(plain, {"OMPI_MCA_orte_local_tmpdir_base": "/s"}) == (plain,
                                                                                      None)


def test_jobs_started_together_do_not_race_for_open_mpis_session_directory(tmp_path):
    # Open MPI's shared per-host directory, made and removed by every mpirun, failed 2 of 200
    # mpiruns started 20 at a time on an empty TMPDIR here ("orte_session_dir failed"). 20
    # jobs at once through mpirun.Launch (hvdrun's and HorovodRunner's), 5 times, each time
    # on an empty TMPDIR: every one has a directory of its own, and leaves nothing.
    import threading
    from horovod_cpp.job import mpirun
    for round_ in range(5):
        tmp = tmp_path / ("tmp%d" % round_)
        tmp.mkdir()
        env = dict(os.environ, TMPDIR=str(tmp))
        env.pop("OMPI_MCA_orte_tmpdir_base", None)
        argv = mpirun.build_command(1, ["true"], oversubscribe=True, mpirun=shutil.which("mpirun"))
        results, lines = [None] * 20, [[] for _ in range(20)]

        def job(i):
            launch = mpirun.Launch(argv, lambda rank, kind, text: lines[i].append(text), env=env)
            results[i] = launch.wait(timeout=100).returncode

        threads = [threading.Thread(target=job, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results == [0] * 20, [l for l, r in zip(lines, results) if r != 0][:2]
        assert os.listdir(tmp) == []


def test_a_failed_job_that_mpirun_does_not_attribute_still_names_the_signal():
    from horovod_cpp.job import mpirun
    # Open MPI can end a job whose rank was killed with only its "Primary job terminated
    # normally, but 1 process returned a non-zero exit code" and 128 + the signal.
    launcher = ["Primary job  terminated normally, but 1 process returned",
                "a non-zero exit code. Per user-direction, the job has been aborted."]
    text = mpirun.Result(137, None, None, {0: [], 1: []}, launcher).describe()
    assert text.startswith("mpirun exited with exit code 137: a rank exited with signal 9 "
                           "(SIGKILL), or with exit code 137; mpirun did not say which rank")
    assert "Primary job" in text  # mpirun's own words follow
    # A plain failure code names nothing it does not know.
    assert mpirun.Result(3, None, None, {}, []).describe() == "mpirun exited with exit code 3"


def test_mpirun_missing():
    empty = os.path.dirname(os.path.abspath(__file__))  # a directory without mpirun
    r = subprocess.run(HVDRUN + ["-np", "2", "true"], capture_output=True, text=True,
                       env={"PATH": empty}, timeout=60)
    assert r.returncode == 127
    assert "mpirun not found on PATH" in r.stderr


# ---- bad arguments -------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["-np", "0", "true"], "-np must be a positive number of ranks, got 0"),
    (["-np", "-2", "true"], "-np must be a positive number of ranks, got -2"),
    (["-np", "5", "-H", "a:2,b:2", "true"], "-np 5 is more than the 4 slots of the given hosts"),
    (["-np", "2", "-H", "a:x", "true"], "slots of 'a:x' must be a positive integer"),
    (["-np", "2", "-H", "a:0", "true"], "host a has 0 slots"),
    (["-np", "2", "-H", "a:1,,b:1", "true"], "empty host entry"),
    (["-np", "2", "-H", "a:1,a:1", "true"], "host a is listed twice"),
    (["-np", "2", "-H", "bad/name:1", "true"], "is not a host name"),
    (["-np", "2", "--hostfile", "/nonexistent/hosts", "true"], "No such file or directory"),
    (["-np", "2"], "no command to run"),
    (["-np", "2", "--cycle-time-ms", "-1", "true"], "-1 is outside [0, 60000]"),
    (["-np", "2", "--cache-capacity", "many", "true"], "expected an integer"),
    (["-np", "2", "--log-level", "loud", "true"], "invalid choice: 'loud'"),
    (["-np", "2", "--mpi-args", "'unclosed", "true"], "--mpi-args: No closing quotation"),
    (["true"], "-np is required: the number of ranks to run"),
    (["-np", "2", "--cpu-operations", "gloo", "true"], "--cpu-operations gloo needs --gloo"),
    (["-np", "2", "--gloo", "--cpu-operations", "mpi", "true"],
     "--cpu-operations mpi needs mpirun (no --gloo)"),
    (["-np", "2", "--cpu-operations", "nccl", "true"], "invalid choice: 'nccl'"),
])
def test_bad_arguments_exit_2(args, message):
    r = hvdrun(args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_hostfile_line(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("alpha slots=2\nbeta cores=4\n")
    r = hvdrun(["-np", "2", "--hostfile", str(hostfile), "true"])
    assert r.returncode == 2
    assert "line 2: expected 'host slots=N', got 'beta cores=4'" in r.stderr



# ---- horovodrun's names for the same settings -------------------------------------------------

def exported(result):
    """The NAME=VALUE pairs hvdrun passes with -x."""
    argv = printed_command(result)
    return {argv[i + 1] for i, a in enumerate(argv) if a == "-x" and "=" in argv[i + 1]}


def test_horovodrun_flag_names_are_accepted(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\n")
    r = hvdrun(["-np", "2", "-hostfile", str(hostfile),
                "--stall-check-warning-time-seconds", "7",
                "--stall-check-shutdown-time-seconds", "30", "--log-level", "DEBUG",
                "--dry-run", "python", "train.py"])
    assert r.returncode == 0, r.stderr
    assert exported(r) == {"HOROVOD_STALL_CHECK_TIME_SECONDS=7.0",
                           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=30.0",
                           "HOROVOD_LOG_LEVEL=debug",
                           "OMP_NUM_THREADS=1"}  # node1 runs 2 ranks
    assert "node1:2" in printed_command(r)


def test_no_stall_check_disables_the_inspector():
    r = hvdrun(["-np", "2", "--no-stall-check", "--dry-run", "python", "train.py"])
    assert r.returncode == 0, r.stderr
    assert exported(r) == {"HOROVOD_STALL_CHECK_DISABLE=1",
                           "OMP_NUM_THREADS=%d" % max(1, CPUS // 2)}


def test_version_and_check_build():
    import horovod_cpp
    from horovod_cpp import _core
    r = hvdrun(["--version"])
    assert r.returncode == 0 and r.stdout.strip() == "hvdrun (horovod_cpp) %s" % (
        horovod_cpp.__version__), (r.stdout, r.stderr)
    r = hvdrun(["--check-build"])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("horovod_cpp v%s" % horovod_cpp.__version__), out
    for line in ("Available Frameworks:", "    [X] PyTorch (horovod_cpp.torch)",
                 "Available Controllers:", "    [X] MPI", "Available Tensor Operations:"):
        assert line in out.splitlines(), out
    nccl = _core.nccl_built()
    assert ("    [X] NCCL " in out) == (nccl != 0), out
    gloo = "    [%s] Gloo" % ("X" if _core.gloo_built() else " ")
    assert out.splitlines().count(gloo) == 2, out  # a controller and a tensor operation
