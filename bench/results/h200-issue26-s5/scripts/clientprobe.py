"""The serve bench's client with absolute stamps (perf_counter is CLOCK_MONOTONIC: one clock across processes)."""
import json, os, sys, time
import xrt.bench.serve_client as sc
pc = time.perf_counter
REC = []
_post = None

async def send(client, url, headers, payload, prompt_len, t0):
    start = pc()
    rec = {"c_start": start}
    REC.append(rec)
    ttft = None
    try:
        async with client.post(url, data=payload, headers=headers) as response:
            rec["c_headers"] = pc()
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue
                now = pc()
                if "c_line" not in rec:
                    rec["c_line"] = now
                data = line[5:].strip()
                if data == b"[DONE]":
                    continue
                chunk = json.loads(data)
                if chunk.get("choices") and ttft is None:
                    ttft = pc() - start
                    rec["c_ttft"] = pc()
    except Exception as e:
        rec["err"] = repr(e)
    return {"ok": True, "error": None, "start": start - t0, "ttft": ttft, "itl": [], "latency": pc() - start,
            "prompt_len": prompt_len, "output_tokens": 1, "cached_tokens": None}
sc.send = send
if __name__ == "__main__":
    rc = sc.main()
    with open(os.environ["PROBE_OUT"] + ".client.json", "w") as f:
        json.dump(REC, f)
    sys.exit(rc)
