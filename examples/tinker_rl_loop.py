"""GRPO on single-digit addition, written only against the official Tinker SDK (cookbook style).

    ajet server --model smollm2-135m-instruct --lora-rank 8 --tinker-key tml-local-key     # in another shell
    python examples/tinker_rl_loop.py --base-url http://127.0.0.1:10086 --api-key tml-local-key

Any server that speaks Tinker's API runs it unchanged. No AgentJet import: see docs/tinker.md."""

import argparse
import random
import re
import time

import tinker
from tinker import types

PAIRS = [(a, b) for a in range(10) for b in range(10)]
HELD_OUT = [(a, b) for a, b in PAIRS if (a + 3 * b) % 5 == 0]  # 20 pairs never trained on
TRAIN = [(a, b) for a, b in PAIRS if (a + 3 * b) % 5 != 0]


def problems(pairs: list[tuple[int, int]]) -> list[tuple[str, int]]:
    return [(f"What is {a} + {b}? Reply with only the number.", a + b) for a, b in pairs]


def reward(text: str, answer: int) -> float:
    m = re.search(r"-?\d+", text)
    return 1.0 if m and int(m.group()) == answer else 0.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", default="http://127.0.0.1:10086")
    p.add_argument("--api-key", default="tml-local-key")
    p.add_argument("--base-model", default=None, help="default: the server's first model")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--max-tokens", type=int, default=8)
    args = p.parse_args()

    service = tinker.ServiceClient(base_url=args.base_url, api_key=args.api_key)
    base = args.base_model or service.get_server_capabilities().supported_models[0].model_name
    trainer = service.create_lora_training_client(base_model=base, rank=8).result()
    tok = trainer.get_tokenizer()
    prompt_ids = lambda q: tok.apply_chat_template([{"role": "user", "content": q}],  # noqa: E731
                                                   add_generation_prompt=True, tokenize=True, return_dict=False)
    params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, stop=[tok.eos_token_id])
    rng, start = random.Random(1), time.monotonic()

    def evaluate(sampler) -> float:  # two samples of each held-out problem
        futs = [(sampler.sample(types.ModelInput.from_ints(prompt_ids(q)), 2, params), a) for q, a in problems(HELD_OUT)]
        rewards = [reward(tok.decode(s.tokens), a) for f, a in futs for s in f.result().sequences]
        return sum(rewards) / len(rewards)

    def report(label: str, sampler) -> None:
        print(f"{label} ({(time.monotonic() - start) / 60:.2f} min): held-out reward {evaluate(sampler):.3f}", flush=True)

    for step in range(args.steps):
        sampler = trainer.save_weights_and_get_sampling_client()
        if step % 5 == 0:
            report(f"step {step}", sampler)
        batch = problems(rng.choices(TRAIN, k=args.batch))
        futs = [(sampler.sample(types.ModelInput.from_ints(prompt_ids(q)), args.group, params), q, a) for q, a in batch]
        data = []
        for fut, q, a in futs:
            seqs = fut.result().sequences
            rewards = [reward(tok.decode(s.tokens), a) for s in seqs]
            mean = sum(rewards) / len(rewards)
            for s, r in zip(seqs, rewards, strict=True):
                if r == mean:
                    continue  # no signal in a group whose rewards are equal
                ids, n = prompt_ids(q) + list(s.tokens), len(prompt_ids(q))
                data.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={
                    "target_tokens": ids[1:],
                    "logprobs": [0.0] * (n - 1) + list(s.logprobs),
                    "advantages": [0.0] * (n - 1) + [r - mean] * len(s.tokens)}))
        if data:
            trainer.forward_backward(data, "importance_sampling").result()
            trainer.optim_step(types.AdamParams(learning_rate=args.lr)).result()
    report(f"final, step {args.steps}", trainer.save_weights_and_get_sampling_client())


if __name__ == "__main__":
    main()
