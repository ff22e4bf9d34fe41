"""One vLLM engine (offline ``LLM``) that answers requests on stdin until stdin closes.

``python engine_process.py MODEL '<vllm args JSON>' [--load-format weightcache --extra '<JSON>']``:
the engine's arguments are parsed by vLLM's own engine-args parser from the same list the daemon
gets (``--engine-args``), as ``vllm serve MODEL <list>`` would. Each stdin line is a JSON request:
``{"prompts": [[ids...], ...], "max_tokens": N}`` → greedy token ids, or ``{"report": true}`` →
each rank's ``weightcache.engine_profiles.report.zero_copy_report``. Each answer is one ``RESULT <json>`` line.
A process of its own per engine: a test runs one vLLM at a time, and vLLM's global state never
leaks between the engines it compares.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("engine_args", help="JSON list: the engine arguments after `vllm serve MODEL`")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--extra", default="{}", help="--model-loader-extra-config as JSON")
    p.add_argument(
        "--gemm",
        choices=["default", "plain"],
        default="default",
        help="plain: unquantized layers compute with F.linear, as an engine from the cache does",
    )
    args = p.parse_args()
    if args.gemm == "plain":
        plain_gemm()

    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from weightcache.engine_profiles.report import zero_copy_report

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = EngineArgs.from_cli_args(parser.parse_args(["--model", args.model, *json.loads(args.engine_args)]))
    defaults = EngineArgs(model=args.model)
    given = {
        f.name: getattr(parsed, f.name)
        for f in dataclasses.fields(EngineArgs)
        if f.name != "model" and getattr(parsed, f.name) != getattr(defaults, f.name)
    }
    llm = LLM(
        model=args.model,
        load_format=args.load_format,
        model_loader_extra_config=json.loads(args.extra),
        **given,
    )
    print("READY", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("report"):
            result: object = llm.apply_model(zero_copy_report)
        else:
            prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
            params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], ignore_eos=True)
            result = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        print("RESULT " + json.dumps(result), flush=True)


def plain_gemm() -> None:
    """vLLM from disk with the cache's CPU GEMM policy (weightcache/vllm/cpu_policy.py): its own
    weights, computed with ``F.linear`` instead of the oneDNN kernels vLLM picks where the CPU has
    them (AVX-512 BF16, AMX), which round bf16 differently. Patched on the classes before the engine
    exists, so its processes (forked) inherit it; exact types only, as the policy marks them."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from weightcache.vllm.cpu_policy import PlainEmbeddingMethod, PlainLinearMethod

    for base, plain in (
        (UnquantizedLinearMethod, PlainLinearMethod),
        (UnquantizedEmbeddingMethod, PlainEmbeddingMethod),
    ):
        original = base.process_weights_after_loading

        def process(self, layer, _base=base, _plain=plain, _original=original):  # type: ignore[no-untyped-def]
            return (_plain.process_weights_after_loading if type(self) is _base else _original)(self, layer)

        base.process_weights_after_loading = process  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
