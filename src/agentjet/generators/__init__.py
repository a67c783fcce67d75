"""The rollout role: generators that sample tokens with their behaviour logprobs (the embedded HF engine, vLLM)."""
