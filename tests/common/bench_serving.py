# An open-loop benchmark client in the manner of vLLM's
# benchmarks/benchmark_serving.py (backend "openai": a streaming POST to
# /v1/completions per request, Poisson arrivals at --request-rate), writing
# the JSON that its --save-result writes (the fields qsim calibrate server
# reads, and the per-request arrays). vLLM itself is not installed: it
# brings torch and CUDA wheels; this is its request loop and its metrics
# (calculate_metrics), with httpx (the openai SDK's HTTP client) instead of
# aiohttp.
#
# Environment: URL (base URL), RATE (model requests/s), SCALE (the
# server's --time-scale: real durations × SCALE = model durations, the
# arrival rate in real time is RATE × SCALE), LENS (a JSON file of
# [[input, output], ...] token counts), OUT (the result file), SEED.
# The prompt is a list of token ids, so the server counts exactly `input`
# tokens; max_tokens = output (the server answers exactly that many).
import asyncio, json, os, random, socket, time
import httpx

url = os.environ["URL"].rstrip("/") + "/v1/completions"
rate = float(os.environ["RATE"])
scale = float(os.environ["SCALE"])
lens = json.load(open(os.environ["LENS"]))
out = os.environ["OUT"]
rnd = random.Random(int(os.environ.get("SEED", "0")))


async def one(client, i, inp, outp):
    body = {"model": "bench", "prompt": list(range(1, inp + 1)), "max_tokens": outp,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    ttft, itl, n, err = 0.0, [], None, ""
    st = time.perf_counter()
    last = st
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                err = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            else:
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        continue
                    now = time.perf_counter()
                    d = json.loads(data)
                    if d.get("choices") and d["choices"][0].get("text"):
                        if ttft == 0.0:
                            ttft = now - st
                        else:
                            itl.append(now - last)
                        last = now
                    if d.get("usage"):
                        n = d["usage"]["completion_tokens"]
    except Exception as e:  # a failed request is reported as vLLM does
        err = repr(e)
    latency = last - st
    ok = not err and ttft > 0
    return {"ok": ok, "ttft": ttft * scale, "itl": [x * scale for x in itl],
            "latency": latency * scale, "out": (n if n is not None else len(itl) + 1) if ok else 0,
            "in": inp, "err": err}


async def main():
    transport = httpx.AsyncHTTPTransport(
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=4096)
    async with httpx.AsyncClient(transport=transport, limits=limits, timeout=600) as client:
        # the initial single-prompt test run (as benchmark_serving does)
        t = await one(client, -1, lens[0][0], 2)
        assert t["ok"], t["err"]
        tasks = []
        t0 = time.perf_counter()
        for i, (inp, outp) in enumerate(lens):
            tasks.append(asyncio.create_task(one(client, i, inp, outp)))
            await asyncio.sleep(rnd.expovariate(rate * scale))
        res = await asyncio.gather(*tasks)
        dur = (time.perf_counter() - t0) * scale
    good = [r for r in res if r["ok"]]
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0
    median = lambda xs: sorted(xs)[len(xs) // 2] if xs else 0.0
    ttfts = [r["ttft"] for r in good]
    itls = [x for r in good for x in r["itl"]]
    e2els = [r["latency"] for r in good]
    tpots = [(r["latency"] - r["ttft"]) / (r["out"] - 1) for r in good if r["out"] > 1]
    tin, tout = sum(r["in"] for r in good), sum(r["out"] for r in good)
    result = {
        "backend": "openai", "model_id": "bench", "num_prompts": len(lens),
        "request_rate": rate, "burstiness": 1.0, "max_concurrency": None,
        "duration": dur, "completed": len(good),
        "total_input_tokens": tin, "total_output_tokens": tout,
        "request_throughput": len(good) / dur, "output_throughput": tout / dur,
        "total_token_throughput": (tin + tout) / dur,
        "input_lens": [r["in"] for r in res], "output_lens": [r["out"] for r in res],
        "ttfts": [r["ttft"] for r in res], "itls": [r["itl"] for r in res],
        "generated_texts": ["" for _ in res], "errors": [r["err"] for r in res],
    }
    for k, xs in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        result[f"mean_{k}_ms"] = mean(xs) * 1e3
        result[f"median_{k}_ms"] = median(xs) * 1e3
        xs2 = sorted(xs)
        result[f"p99_{k}_ms"] = (xs2[min(len(xs2) - 1, int(0.99 * len(xs2)))] if xs2 else 0.0) * 1e3
    with open(out, "w") as f:
        json.dump(result, f)
    print(json.dumps({"completed": len(good), "failed": len(res) - len(good),
                      "duration": dur, "mean_ttft_ms": result["mean_ttft_ms"],
                      "mean_itl_ms": result["mean_itl_ms"], "mean_e2el_ms": result["mean_e2el_ms"]}))


asyncio.run(main())
