"""One vLLM engine (offline ``LLM``) that answers requests on stdin until stdin closes.

``python engine_process.py MODEL '<vllm args JSON>' [--load-format weightcache --extra '<JSON>']``:
the engine's arguments are parsed by vLLM's own engine-args parser from the same list the daemon
gets (``--vllm-args``), as ``vllm serve MODEL <list>`` would. Each stdin line is a JSON request:
``{"prompts": [[ids...], ...], "max_tokens": N}`` → greedy token ids, or ``{"report": true}`` →
each rank's ``weightcache.vllm.report.zero_copy_report``. Each answer is one ``RESULT <json>`` line.
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
    p.add_argument("vllm_args", help="JSON list: the engine arguments after `vllm serve MODEL`")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--extra", default="{}", help="--model-loader-extra-config as JSON")
    args = p.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from weightcache.vllm.report import zero_copy_report

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = EngineArgs.from_cli_args(parser.parse_args(["--model", args.model, *json.loads(args.vllm_args)]))
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


if __name__ == "__main__":
    main()
