"""Throughput of portable_ckpt on S3 vs plain boto3 upload_file/download_file, same bytes, same run.

Starts a loopback moto server (``python -m moto.server``) unless ``--endpoint`` is given, builds a
~256 MiB checkpoint, then alternates, for ``--rounds`` rounds:

  upload:   pck save_arrays -> s3://      | pck copy local -> s3://   | boto3 upload_file
  download: pck read (all tensors, to RAM)| pck copy s3:// -> local   | boto3 download_file

and reports median MiB/s per method and the ratios against boto3. Every pck path verifies every
CRC32C block and sends/compares S3 native CRC32C; boto3's transfer manager does neither (it sends
its default CRC32 request checksum only).

    .venv/bin/python bench/bench_s3.py [--size-mib 256] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

MIB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto server did not start")


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--endpoint", default=None, help="use this S3 endpoint instead of moto")
    ap.add_argument("--part-mib", type=int, default=None, help="PCK_S3_PART_SIZE in MiB")
    ap.add_argument("--json", default=None, help="also write results here")
    args = ap.parse_args()

    proc = None
    endpoint = args.endpoint
    if endpoint is None:
        proc, endpoint = _start_moto()
    os.environ.update({
        "AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "bench"),
        "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "bench"),
    })
    if args.part_mib:
        os.environ["PCK_S3_PART_SIZE"] = str(args.part_mib * MIB)

    import boto3

    import portable_ckpt
    from portable_ckpt.io.copy import copy_version

    bucket = f"pck-bench-{uuid.uuid4().hex[:8]}"
    boto = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    boto.create_bucket(Bucket=bucket)
    tmp = tempfile.mkdtemp(prefix="pck-bench-")
    try:
        n_tensors = 4
        per = args.size_mib * MIB // n_tensors // 4
        rng = np.random.default_rng(0)
        arrays = {f"layer{i}.w": rng.standard_normal(per, dtype=np.float32)
                  for i in range(n_tensors)}
        local = os.path.join(tmp, "local")
        man = portable_ckpt.save_arrays(local, arrays, step=1)
        attempt = man.attempt_id
        nbytes = sum(f.size for f in man.files.values())
        data_files = [os.path.join(local, attempt, p) for p in man.files]
        mib = nbytes / MIB
        print(f"checkpoint: {len(man.files)} files, {mib:.1f} MiB; endpoint {endpoint}; "
              f"{args.rounds} rounds", flush=True)

        times: dict[str, list[float]] = {k: [] for k in (
            "pck_save", "pck_copy_up", "boto_upload_file",
            "pck_read", "pck_copy_down", "boto_download_file")}
        for r in range(args.rounds):
            root = f"s3://{bucket}/r{r}"
            times["pck_save"].append(_timed(
                lambda root=root: portable_ckpt.save_arrays(root + "-save", arrays, step=1)))
            times["boto_upload_file"].append(_timed(lambda r=r: [
                boto.upload_file(f, bucket, f"boto{r}/{os.path.basename(f)}")
                for f in data_files]))
            times["pck_copy_up"].append(_timed(
                lambda root=root: copy_version(local, root, record=False)))

            def read_all(root: str = root) -> None:
                ck = portable_ckpt.open(root)
                for k in ck.tensors:
                    ck.read(k)

            times["pck_read"].append(_timed(read_all))
            down = os.path.join(tmp, f"down{r}")
            os.makedirs(down)
            times["boto_download_file"].append(_timed(lambda r=r, down=down: [
                boto.download_file(bucket, f"boto{r}/{os.path.basename(f)}",
                                   os.path.join(down, os.path.basename(f)))
                for f in data_files]))
            times["pck_copy_down"].append(_timed(
                lambda root=root, r=r: copy_version(root, os.path.join(tmp, f"copy{r}"),
                                                    record=False)))
            # Free the server's memory between rounds.
            for pfx in (f"r{r}", f"boto{r}"):
                for page in boto.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                           Prefix=pfx):
                    keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                    if keys:
                        boto.delete_objects(Bucket=bucket, Delete={"Objects": keys})
            shutil.rmtree(down, ignore_errors=True)
            shutil.rmtree(os.path.join(tmp, f"copy{r}"), ignore_errors=True)
            print(f"round {r}: " + ", ".join(f"{k} {mib / v[-1]:.0f}" for k, v in times.items())
                  + " MiB/s", flush=True)

        med = {k: mib / statistics.median(v) for k, v in times.items()}
        ratios = {
            "upload_pck_save_vs_boto": med["pck_save"] / med["boto_upload_file"],
            "upload_pck_copy_vs_boto": med["pck_copy_up"] / med["boto_upload_file"],
            "download_pck_read_vs_boto": med["pck_read"] / med["boto_download_file"],
            "download_pck_copy_vs_boto": med["pck_copy_down"] / med["boto_download_file"],
        }
        print("\nmedian MiB/s:")
        for k, v in med.items():
            print(f"  {k:20s} {v:8.1f}")
        print("ratios (pck / boto3, >1 = pck faster):")
        for k, v in ratios.items():
            print(f"  {k:28s} {v:6.2f}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"mib": mib, "rounds": args.rounds, "endpoint": endpoint,
                           "median_mib_per_s": med, "ratios": ratios,
                           "seconds": times}, fh, indent=2)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
