"""The benchmark command for benchmarks/tp_decode_server.py: asks the server for one decode run and
prints the server's own tokens/s (the line commdiag ab reads, as it reads any benchmark's stdout).

    python benchmarks/tp_decode_client.py --port P [--steps 400]
"""

import argparse
import json
import urllib.request


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--steps", type=int, default=400)
    a = ap.parse_args()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # localhost, never a proxy
    with opener.open(f"http://127.0.0.1:{a.port}/decode?steps={a.steps}", timeout=600) as r:
        res = json.loads(r.read())
    print(f"ranks: {res['ranks']}  steps: {res['steps']}  batch: {res['batch']}  seconds: {res['seconds']:.3f}")
    print(f"decode tokens/s: {res['tokens_per_s']:.2f}")


if __name__ == "__main__":
    main()
