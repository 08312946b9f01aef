import json, pickle, time, timeit, random, asyncio
from xrt.config.compose import load_config
from xrt.engine.llm import LLM
from xrt.serve.protocol import CompletionRequest
from xrt.serve.prepare import prepare_completion, SamplingCache
from xrt.serve.wire import frame, Frames
from xrt.serve.responses import Shapes
from xrt.engine.outputs import StreamOutput
cfg = load_config(["model=qwen3-tiny"])
llm = LLM(cfg)
adm = llm.engine.admission
random.seed(0)
ids = [random.randrange(1000) for _ in range(1000)]
payload = {"model": None, "prompt": ids, "max_tokens": 256, "temperature": 0.0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
raw = json.dumps(payload).encode()
def t(name, f, n=2000):
    f()
    s = timeit.timeit(f, number=n) / n * 1e6
    print(f"{name:40s} {s:8.1f} us")
t("json.dumps payload", lambda: json.dumps(payload).encode())
t("model_validate_json", lambda: CompletionRequest.model_validate_json(raw))
body = CompletionRequest.model_validate_json(raw)
sc = SamplingCache(cfg.sampling)
t("prepare_completion", lambda: prepare_completion(body, adm, sc))
p = prepare_completion(body, adm, sc)
r = p.requests[0]
t("frame add", lambda: frame(("add", 1, r)))
print("frame add bytes", len(frame(("add", 1, r))))
t("pickle ids list", lambda: pickle.dumps(r.prompt_token_ids, 5))
t("pickle sampling", lambda: pickle.dumps(r.sampling, 5))
print(type(r), r.__dict__.keys() if hasattr(r,'__dict__') else r)
fr = frame(("add", 1, r))
t("unpickle add", lambda: Frames().feed(fr))
sh = Shapes(False, "m", True, adm.tokenizer)
t("Shapes()", lambda: Shapes(False, "m", True, adm.tokenizer))
t("chunk", lambda: sh.chunk(0, "hello", logprobs=None))
