#!/usr/bin/env python3
"""The GPU check: the embedded Triton 2.51 on a real GPU, with the standard library only.

Run by scripts/gpu_check.sh on a lent GPU machine (no internet, Python 3.12, CUDA torch, numpy 2).
It unpacks the bundle made by scripts/pack_gpu_bundle.py, builds a model environment where
numpy 1.26 shadows the machine's numpy 2 while torch stays importable, starts ``tritonserver``
with the GPU visible, serves ``gpu_torch`` (Python backend, KIND_GPU) and ``c_scale`` (the C
backend ``scale``), drives both over HTTP, and writes ``gpu_check_report.md`` + ``.json`` to --out.

Nothing here imports tritonclient or lab_backends' server (neither is installed there): plain
``http.client`` speaks the KServe v2 JSON protocol. Every loop is bounded in count and time.
``--cpu-smoke`` runs the same path on a CPU machine (``--model-config-name=cpu_smoke``) so the
script itself is tested where no GPU is lent.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import threading
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECK_MODELS = ROOT / "scripts" / "gpu_check_models"
C_SCALE_CONFIG = ROOT / "model_repository" / "c_scale" / "config.pbtxt"
PY_MODEL = "gpu_torch"
CPU_TWIN = "cpu_torch"  # same model.py and work on KIND_CPU: the CPU figures beside the GPU ones
C_MODEL = "c_scale"


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def sh(cmd: list[str], timeout: float = 60) -> tuple[int, str]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return done.returncode, (done.stdout + done.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------------------- setup
def gpu_inventory() -> dict:
    info: dict = {"nvidia_smi": shutil.which("nvidia-smi")}
    if info["nvidia_smi"]:
        info["list"] = sh(["nvidia-smi", "-L"])[1]
        info["query"] = sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used,"
                            "utilization.gpu,power.draw", "--format=csv,noheader"])[1]
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.cuda.is_available()
        if info["torch_cuda"]:
            info["torch_device"] = torch.cuda.get_device_name(0)
    except Exception as exc:  # noqa: BLE001 - report what is there
        info["torch"] = f"not importable: {exc}"
    return info


def unpack(bundle: Path, work: Path) -> Path:
    """Extract triton-bundle.tar.xz (or the plain .tar tests make) into ``work``; returns ``work/triton``."""
    target = work / "triton"
    if not (target / "bin" / "tritonserver").exists():
        archive = next(iter(sorted(bundle.glob("triton-bundle.tar*"))), None)
        if archive is None:
            raise FileNotFoundError(f"no triton-bundle.tar.xz in {bundle}: run scripts/pack_gpu_bundle.py")
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(work, filter="tar") if hasattr(tarfile, "data_filter") else tar.extractall(work)
    return target


def find_libpython() -> Path | None:
    """The folder holding libpython<X.Y>.so.1.0 that the stub embeds (it must match this Python)."""
    soname = f"libpython{sys.version_info[0]}.{sys.version_info[1]}.so.1.0"
    dirs = [sysconfig.get_config_var(v) for v in ("LIBDIR", "LIBPL")]
    dirs += [str(Path(sys.base_prefix) / "lib"), "/usr/lib/x86_64-linux-gnu", "/usr/local/lib", "/usr/lib"]
    for d in filter(None, dirs):
        if (Path(d) / soname).exists():
            return Path(d)
    code, out = sh(["ldconfig", "-p"])
    for line in out.splitlines():
        if soname in line and "=>" in line:
            return Path(line.split("=>")[1].strip()).parent
    return None


def make_model_env(work: Path, wheels: Path) -> tuple[Path, str]:
    """A venv whose own site-packages (numpy 1.26) come before this interpreter's (torch & co.).

    The stub finds its ``sys.prefix`` through ``python3`` on ``PATH``, so putting this venv's
    ``bin`` first makes model.py see numpy 1.26 first and the machine's torch after it (a ``.pth``
    line ``site.addsitedir`` appends those, with their own ``.pth`` files).
    """
    env = work / "model_env"
    if not (env / "bin" / "python3").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site_dir = env / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    for wheel in sorted(wheels.glob(f"*-{tag}-*.whl")):
        with zipfile.ZipFile(wheel) as zf:  # a wheel is a zip of site-packages content
            zf.extractall(site_dir)
    host_sites = [p for p in __import__("site").getsitepackages() if Path(p).is_dir()]
    (site_dir / "zz_host_site_packages.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in host_sites) + "\n"
    )
    probe = ("import numpy, sys; print('numpy', numpy.__version__, numpy.__file__);"
             "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())")
    code, out = sh([str(env / "bin" / "python3"), "-c", probe], timeout=120)
    return env, out if code == 0 else f"FAILED ({code}): {out[-800:]}"


def build_c_backend(triton: Path, backends: Path) -> str:
    """``scale`` into backends/scale: built here with gcc (via lab_backends.server.cbackend when it loads), else prebuilt."""
    server_lib = next(iter(sorted((triton / "lib").glob("libtritonserver*.so*"))), None)
    source = ROOT / "c_backends" / "scale" / "scale.c"
    target = backends / "scale" / "libtriton_scale.so"
    if shutil.which("gcc") and server_lib and source.exists():
        try:
            # Import the module by path: lab_backends/__init__ pulls tritonclient, absent here.
            import importlib.util
            import types

            pkg = types.ModuleType("lab_backends")
            pkg.__path__ = [str(ROOT / "lab_backends")]
            sys.modules.setdefault("lab_backends", pkg)
            sub = types.ModuleType("lab_backends.server")  # skip server/__init__ (needs tritonclient)
            sub.__path__ = [str(ROOT / "lab_backends" / "server")]
            sys.modules.setdefault("lab_backends.server", sub)
            spec = importlib.util.spec_from_file_location("lab_backends.server.cbackend", ROOT / "lab_backends" / "server" / "cbackend.py")
            cbackend = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(cbackend)
            cbackend._server_library = lambda: server_lib  # the bundled one, not the wheel's
            cbackend.build(source, "scale", backends)
            return "built here with gcc by lab_backends.server.cbackend"
        except Exception as exc:  # noqa: BLE001 - fall back to the prebuilt library
            reason = f"gcc build failed ({str(exc)[:300]})"
    else:
        reason = "no gcc, server library or c_backends/scale/scale.c here"
    prebuilt = triton / "prebuilt_backends" / "scale" / "libtriton_scale.so"
    if prebuilt.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(prebuilt, target)
        return f"prebuilt on the packing machine ({reason})"
    return f"unavailable: {reason}"


def missing_libraries(binary: Path, ld_library_path: str) -> list[str]:
    """Sonames ``ldd`` cannot resolve: a stub with a missing library hangs its model load silently."""
    if not shutil.which("ldd"):
        return []
    env = dict(os.environ, LD_LIBRARY_PATH=ld_library_path)
    try:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=env, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.split("=>")[0].strip() for ln in out.splitlines() if "not found" in ln]


def library_path(triton: Path, libpython: Path | None) -> str:
    dirs = [str(triton / "lib")] + ([str(libpython)] if libpython else [])
    dirs += [d for d in ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib") if Path(d).is_dir()]
    if os.environ.get("LD_LIBRARY_PATH"):
        dirs.append(os.environ["LD_LIBRARY_PATH"])
    return os.pathsep.join(dirs)


# ---------------------------------------------------------------------------------------- server
def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Server:
    """tritonserver in its own process group, stopped by PID (never by name)."""

    def __init__(self, triton: Path, repo: Path, backends: Path, env_dir: Path | None, libpython: Path | None,
                 log_path: Path, config_name: str | None) -> None:
        self.http, self.grpc, self.metrics = free_ports(3)
        args = [
            str(triton / "bin" / "tritonserver"),
            f"--model-repository={repo}", f"--backend-directory={backends}",
            f"--cache-directory={triton / 'caches'}", "--cache-config=local,size=1048576",
            "--http-address=127.0.0.1", f"--http-port={self.http}",
            "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc}",
            "--metrics-address=127.0.0.1", f"--metrics-port={self.metrics}",
            "--allow-metrics=true", "--allow-gpu-metrics=true", "--metrics-interval-ms=500",
            "--model-control-mode=explicit", "--load-model=*", "--exit-on-error=false",
            "--strict-readiness=false", "--exit-timeout-secs=10", "--log-verbose=0",
        ]
        if config_name:
            args.append(f"--model-config-name={config_name}")
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = library_path(triton, libpython)
        if env_dir is not None:
            env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
            env["VIRTUAL_ENV"] = str(env_dir)
        env.pop("PYTHONHOME", None)
        env.setdefault("OMP_NUM_THREADS", "1")
        self.log_path = log_path
        self.shm_before = set(Path("/dev/shm").glob("triton_python_backend_shm_region_*"))
        with open(log_path, "wb") as fh:
            self.proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)

    def get(self, path: str, port: int | None = None, timeout: float = 10) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port or self.http, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def wait_ready(self, deadline_s: float) -> bool:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                if self.get("/v2/health/ready", timeout=2)[0] == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.25)
        return False

    def model_ready(self, name: str) -> bool:
        try:
            return self.get(f"/v2/models/{name}/ready", timeout=5)[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        for leftover in set(Path("/dev/shm").glob("triton_python_backend_shm_region_*")) - self.shm_before:
            leftover.unlink(missing_ok=True)

    def log_lines(self, pattern: str) -> list[str]:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return [ln for ln in text.splitlines() if re.search(pattern, ln)]


# ---------------------------------------------------------------------------------------- client
def infer_body(name: str, rows: list[list[float]]) -> bytes:
    return json.dumps({"inputs": [{"name": name, "shape": [len(rows), len(rows[0])], "datatype": "FP32",
                                   "data": [v for row in rows for v in row]}]}).encode()


def post_infer(conn: http.client.HTTPConnection, model: str, body: bytes) -> dict:
    conn.request("POST", f"/v2/models/{model}/infer", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    payload = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"{model}: HTTP {resp.status}: {payload[:300]!r}")
    return {o["name"]: o for o in json.loads(payload)["outputs"]}


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(values), "mean_ms": round(statistics.fmean(values), 3), "p50_ms": round(pick(0.5), 3),
            "p90_ms": round(pick(0.9), 3), "p99_ms": round(pick(0.99), 3)}


def timed_posts(server: Server, model: str, body: bytes, count: int, end: float, times: list[float]) -> None:
    """Up to ``count`` requests on one keep-alive connection until ``end``, each latency appended to
    ``times`` as it comes (so that an error keeps what was measured before it)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http, timeout=30)
    try:
        for _ in range(count):
            if time.monotonic() > end:
                break
            t0 = time.perf_counter()
            post_infer(conn, model, body)
            times.append((time.perf_counter() - t0) * 1e3)
    finally:
        conn.close()


def sequential(server: Server, model: str, body: bytes, count: int, budget_s: float) -> dict:
    times: list[float] = []
    timed_posts(server, model, body, count, time.monotonic() + budget_s, times)
    return percentiles(times)


def concurrent(server: Server, model: str, body: bytes, workers: int, per_worker: int, budget_s: float) -> dict:
    """``workers`` threads, one keep-alive connection each, ``per_worker`` requests each, bounded in time."""
    times: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    end = time.monotonic() + budget_s

    def worker() -> None:
        mine: list[float] = []
        try:
            timed_posts(server, model, body, per_worker, end, mine)
        except Exception as exc:  # noqa: BLE001 - counted and reported
            with lock:
                errors.append(str(exc)[:200])
        finally:
            with lock:
                times.extend(mine)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=budget_s + 30)
    wall = time.perf_counter() - t0
    result = percentiles(times)
    result.update({"concurrency": workers, "wall_s": round(wall, 3),
                   "req_per_s": round(len(times) / wall, 1) if wall else 0.0, "errors": errors[:3]})
    return result


def model_stats(server: Server, model: str) -> dict:
    code, body = server.get(f"/v2/models/{model}/stats")
    if code != 200:
        return {"error": f"HTTP {code}: {body[:200]!r}"}
    stats = json.loads(body)["model_stats"][0]
    infer, execs = int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))
    istats = stats.get("inference_stats", {})

    def avg_ms(key: str) -> float:
        entry = istats.get(key, {})
        return round(int(entry.get("ns", 0)) / max(1, int(entry.get("count", 0))) / 1e6, 3)

    return {
        "inference_count": infer, "execution_count": execs,
        "avg_batch": round(infer / execs, 2) if execs else None,
        "batch_sizes": {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])},
        "avg_queue_ms": avg_ms("queue"), "avg_compute_infer_ms": avg_ms("compute_infer"),
        "cache_hits": int(istats.get("cache_hit", {}).get("count", 0)),
    }


def gpu_metrics(server: Server) -> list[str]:
    try:
        code, body = server.get("/metrics", port=server.metrics)
    except OSError as exc:
        return [f"metrics unreachable: {exc}"]
    keep = ("nv_gpu_", "nv_energy_", "nv_inference_count{", "nv_inference_exec_count{")
    return [ln for ln in body.decode(errors="replace").splitlines() if ln.startswith(keep)]


class SmiSampler:
    """nvidia-smi every 0.5 s while a load runs (Triton's nv_gpu_* metrics need DCGM, which may not start)."""

    def __init__(self, max_samples: int = 240) -> None:
        self.samples: list[str] = []
        self.max_samples = max_samples
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set() and len(self.samples) < self.max_samples:
            code, out = sh(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,power.draw",
                            "--format=csv,noheader,nounits"], timeout=5)
            if code == 0 and out:
                self.samples.append(out.splitlines()[0])
            self._stop.wait(0.5)

    def __enter__(self) -> "SmiSampler":
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def summary(self) -> dict:
        rows = []
        for line in self.samples:
            try:
                rows.append([float(x) for x in line.split(",")])
            except ValueError:
                continue
        if not rows:
            return {"samples": 0}
        util, mem, power = zip(*rows)
        return {"samples": len(rows), "util_max_pct": max(util), "util_mean_pct": round(statistics.fmean(util), 1),
                "mem_used_max_mib": max(mem), "power_max_w": max(power)}


# ---------------------------------------------------------------------------------------- main
def run(args: argparse.Namespace, report: dict) -> dict:
    """Fill ``report`` step by step, so that a failure still leaves what was learned before it."""
    t_start = time.monotonic()
    report.update({"python": sys.version.split()[0], "executable": sys.executable,
                   "mode": "cpu-smoke" if args.cpu_smoke else "gpu"})
    report["gpu"] = gpu_inventory()
    log(f"GPU: {report['gpu'].get('list') or report['gpu'].get('torch_device') or 'none seen'}")
    if not args.cpu_smoke and not report["gpu"].get("torch_cuda") and not report["gpu"].get("list"):
        report["verdict"] = "no GPU visible: nvidia-smi and torch.cuda both see none"
        return report

    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    triton = unpack(args.bundle, work)
    libpython = find_libpython()
    report["libpython_dir"] = str(libpython) if libpython else None
    env_dir, probe = make_model_env(work, args.bundle / "wheels")
    report["model_env"] = probe
    log(f"model environment: {probe}")

    backends = work / "backends"
    (backends / "python").mkdir(parents=True, exist_ok=True)
    for f in (triton / "backends" / "python").iterdir():
        shutil.copy2(f, backends / "python" / f.name)
    report["c_backend"] = build_c_backend(triton, backends)
    log(f"C backend scale: {report['c_backend']}")

    ld_path = library_path(triton, libpython)
    report["missing_libraries"] = {
        "tritonserver": missing_libraries(triton / "bin" / "tritonserver", ld_path),
        "python_stub": missing_libraries(backends / "python" / "triton_python_backend_stub", ld_path),
    }
    if report["missing_libraries"]["tritonserver"]:
        report["verdict"] = f"FAIL: tritonserver cannot start, missing {report['missing_libraries']['tritonserver']}"
        return report
    repo = work / "models"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    if report["missing_libraries"]["python_stub"]:
        # Loading it would hang for minutes with no error: skip it and say why.
        report["py_skipped"] = f"the Python stub misses {report['missing_libraries']['python_stub']}"
        log(report["py_skipped"])
    else:
        shutil.copytree(CHECK_MODELS / PY_MODEL, repo / PY_MODEL, ignore=shutil.ignore_patterns("__pycache__"))
        if not args.cpu_smoke:  # the smoke test is on a CPU already
            (repo / CPU_TWIN / "1").mkdir(parents=True)
            shutil.copy2(CHECK_MODELS / CPU_TWIN / "config.pbtxt", repo / CPU_TWIN / "config.pbtxt")
            shutil.copy2(CHECK_MODELS / PY_MODEL / "1" / "model.py", repo / CPU_TWIN / "1" / "model.py")
    if C_SCALE_CONFIG.exists() and (backends / "scale").exists():
        (repo / C_MODEL / "1").mkdir(parents=True)
        shutil.copy2(C_SCALE_CONFIG, repo / C_MODEL / "config.pbtxt")

    log_path = args.out / "tritonserver.log"
    server = Server(triton, repo, backends, env_dir, libpython, log_path, "cpu_smoke" if args.cpu_smoke else None)
    report["server_pid"] = server.proc.pid
    try:
        t0 = time.monotonic()
        ready = server.wait_ready(args.ready_timeout)
        # Models load after the server turns ready (explicit mode, --strict-readiness=false).
        models = [m for m in (PY_MODEL, CPU_TWIN, C_MODEL) if (repo / m).exists()]
        end = t0 + args.ready_timeout
        while ready and time.monotonic() < end and not all(server.model_ready(m) for m in models):
            if server.proc.poll() is not None or server.log_lines(r"failed to load|Poll failed"):
                break
            time.sleep(0.5)
        report["startup_s"] = round(time.monotonic() - t0, 1)
        report["server_ready"] = ready
        report["models_ready"] = {m: server.model_ready(m) for m in models}
        report["log_gpu_lines"] = server.log_lines(r"_torch ready|CUDA|GPU|failed|error")[-15:]
        log(f"ready={ready} models={report['models_ready']} after {report['startup_s']} s")

        if report["models_ready"].get(PY_MODEL):
            conn = http.client.HTTPConnection("127.0.0.1", server.http, timeout=60)
            rows = [[float(i + 16 * r) for i in range(1, 17)] for r in range(4)]
            out = post_infer(conn, PY_MODEL, infer_body("INPUT0", rows))
            conn.close()
            expected = [2 * v for row in rows for v in row]
            report["py_correct"] = out["OUTPUT0"]["data"] == expected
            report["py_device"] = out["DEVICE"]["data"][0]
            one = infer_body("INPUT0", [[float(i) for i in range(16)]])
            report["py_sequential"] = sequential(server, PY_MODEL, one, args.requests, budget_s=40)
            with SmiSampler() as sampler:
                report["py_concurrent"] = concurrent(server, PY_MODEL, one, args.concurrency,
                                                     max(1, args.requests // 4), budget_s=45)
            report["py_gpu_during_load"] = sampler.summary()
            report["py_stats"] = model_stats(server, PY_MODEL)
            log(f"gpu_torch: correct={report['py_correct']} device={report['py_device']} "
                f"seq={report['py_sequential']} conc={report['py_concurrent']}")
        if report["models_ready"].get(CPU_TWIN):
            one = infer_body("INPUT0", [[float(i) for i in range(16)]])
            conn = http.client.HTTPConnection("127.0.0.1", server.http, timeout=60)
            out = post_infer(conn, CPU_TWIN, one)
            conn.close()
            report["cpu_device"] = out["DEVICE"]["data"][0]
            report["cpu_sequential"] = sequential(server, CPU_TWIN, one, args.requests, budget_s=20)
            report["cpu_concurrent"] = concurrent(server, CPU_TWIN, one, args.concurrency,
                                                  max(1, args.requests // 4), budget_s=25)
            report["cpu_stats"] = model_stats(server, CPU_TWIN)
            report["gpu_vs_cpu"] = side_by_side(report)
            log(f"cpu_torch: seq={report['cpu_sequential']} conc={report['cpu_concurrent']}")
        if report["models_ready"].get(C_MODEL):
            conn = http.client.HTTPConnection("127.0.0.1", server.http, timeout=60)
            row = [float(i) for i in range(1, 9)]
            out = post_infer(conn, C_MODEL, infer_body("INPUT0", [row]))
            conn.close()
            report["c_output"] = out["OUTPUT0"]["data"]
            report["c_correct"] = out["OUTPUT0"]["data"] == [2.0 * v for v in row]  # factor "2" in its config
            body = infer_body("INPUT0", [row])
            report["c_sequential"] = sequential(server, C_MODEL, body, args.requests, budget_s=15)
            report["c_concurrent"] = concurrent(server, C_MODEL, body, args.concurrency, max(1, args.requests // 4),
                                                budget_s=15)
            report["c_stats"] = model_stats(server, C_MODEL)
        report["metrics"] = gpu_metrics(server)
        report["gpu_after"] = gpu_inventory().get("query")
    finally:
        server.stop()
        report["server_stopped"] = server.proc.poll() is not None
    report["total_s"] = round(time.monotonic() - t_start, 1)
    ok = report.get("py_correct") and (args.cpu_smoke or "cuda" in str(report.get("py_device")))
    report["verdict"] = "PASS" if ok else "FAIL (see details)"
    return report


def side_by_side(report: dict) -> list[dict]:
    """The same model and work on the GPU and on one CPU core, measured in this run: one row each."""
    rows = []
    for label, key in (("gpu_torch (KIND_GPU)", "py"), ("cpu_torch (KIND_CPU)", "cpu")):
        seq, conc = report.get(f"{key}_sequential") or {}, report.get(f"{key}_concurrent") or {}
        rows.append({"model": label, "seq_p50_ms": seq.get("p50_ms"), "seq_p99_ms": seq.get("p99_ms"),
                     f"c{conc.get('concurrency')}_p50_ms": conc.get("p50_ms"), "req_per_s": conc.get("req_per_s"),
                     "avg_batch": (report.get(f"{key}_stats") or {}).get("avg_batch")})
    gpu, cpu = rows[0]["req_per_s"], rows[1]["req_per_s"]
    if gpu and cpu:
        rows.append({"model": "GPU / CPU throughput", "ratio": round(gpu / cpu, 1)})
    return rows


def write_report(report: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    gpu = report.get("gpu", {})
    lines = [
        "# GPU check report", "",
        f"- verdict: **{report.get('verdict')}** (mode {report.get('mode')}, total {report.get('total_s')} s)",
        f"- GPU seen: {gpu.get('list') or 'none'}; torch {gpu.get('torch')} cuda={gpu.get('torch_cuda')}",
        f"- nvidia-smi before: {gpu.get('query')}; after: {report.get('gpu_after')}",
        f"- Python {report.get('python')}; libpython for the stub: {report.get('libpython_dir')}; "
        f"unresolved libraries: {report.get('missing_libraries')}",
        f"- Python model skipped: {report['py_skipped']}" if report.get("py_skipped") else "- Python model: served",
        f"- model environment: {report.get('model_env')}",
        f"- server ready: {report.get('server_ready')} in {report.get('startup_s')} s; models: {report.get('models_ready')}",
        "", "## gpu_torch (Python backend, KIND_GPU, dynamic batching)",
        f"- correct round trip (numpy<2 check): {report.get('py_correct')}; ran on: {report.get('py_device')}",
        f"- sequential latency: {report.get('py_sequential')}",
        f"- concurrent: {report.get('py_concurrent')}",
        f"- batch stats: {report.get('py_stats')}",
        f"- nvidia-smi during the concurrent load: {report.get('py_gpu_during_load')}",
        "", "## cpu_torch (the same model.py and work, KIND_CPU, one thread), same server, same run",
        f"- ran on: {report.get('cpu_device')}; sequential: {report.get('cpu_sequential')}",
        f"- concurrent: {report.get('cpu_concurrent')}; stats: {report.get('cpu_stats')}",
        "", "## GPU next to CPU", *[f"- {row}" for row in report.get("gpu_vs_cpu", [])],
        "", "## c_scale (C backend `scale`)",
        f"- backend library: {report.get('c_backend')}",
        f"- correct: {report.get('c_correct')}; sequential: {report.get('c_sequential')}",
        f"- concurrent: {report.get('c_concurrent')}; stats: {report.get('c_stats')}",
        "", "## GPU metrics (Triton /metrics)", "```", *report.get("metrics", [])[:40], "```",
        "", "## Server log lines", "```", *report.get("log_gpu_lines", []), "```",
    ]
    path = out / "gpu_check_report.md"
    path.write_text("\n".join(str(x) for x in lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / "build" / "gpu_bundle")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lab_gpu_check"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "build" / "gpu_check_out"))
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--ready-timeout", type=float, default=120)
    parser.add_argument("--cpu-smoke", action="store_true", help="KIND_CPU config; no GPU required")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {}

    def on_sigterm(signum: int, frame: object) -> None:  # `timeout` sends SIGTERM: unwind, stop the server
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        run(args, report)
    except SystemExit as exc:
        report["verdict"] = f"STOPPED by signal (exit {exc.code}) before the end"
    except Exception as exc:  # noqa: BLE001 - a report is always written
        report["verdict"] = f"ERROR: {type(exc).__name__}: {exc}"
    path = write_report(report, args.out)
    log(f"{report.get('verdict')} - report: {path}")
    return 0 if str(report.get("verdict")).startswith("PASS") else 1


if __name__ == "__main__":
    raise SystemExit(main())
