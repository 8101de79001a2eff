# SCRATCH (helper session diagnosis; to be deleted)
import json, os, signal, subprocess, sys, time
from pathlib import Path
import psutil
from .test_outcomes import ui  # noqa: F401

N = int(os.environ.get("DIAG_N", "4"))

def test_diag(ui, tmp_path):
    base, env, p = ui
    env = {**env, "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
           "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
           "PYTHONPATH": "/tmp/diag_site" + os.pathsep + env.get("PYTHONPATH", "")}
    out_dir = Path("/tmp/diag_out"); out_dir.mkdir(exist_ok=True)
    for i in range(N):
        t0 = time.monotonic()
        out = open(out_dir / f"run{i}.out", "w")
        proc = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "dags", "test", "ledgerbatch_offsets",
                                 "--use-executor", "-c", json.dumps({"pipeline": p.name, "by": "alice", "reason": "look"})],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=float(os.environ.get("DIAG_TIMEOUT", "150")))
            print(f"run {i}: rc {rc} in {time.monotonic() - t0:.1f}s", flush=True)
        except subprocess.TimeoutExpired:
            print(f"run {i}: HUNG after {time.monotonic() - t0:.1f}s", flush=True)
            tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
            with open(out_dir / f"run{i}.tree", "w") as f:
                for c in [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True):
                    try:
                        f.write(f"{c.pid} ppid={c.ppid()} status={c.status()} {c.cmdline()}\n")
                    except psutil.Error:
                        pass
            for pid in tree:
                try:
                    os.kill(pid, signal.SIGUSR1)
                except OSError:
                    pass
                time.sleep(0.3)
            time.sleep(3)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            out.close()
