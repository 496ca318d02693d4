"""The trainflow model as lm-evaluation-harness's model (`lm_eval.api.model.LM`): its log-likelihood and greedy
generation requests computed by trainflow.evaluate.score, as the two local task forms are. Imported only through
trainflow.evaluate.harness, which imports lm_eval offline first."""

from __future__ import annotations

from lm_eval.api.model import LM

from trainflow.evaluate.score import Tokenizer, batched_loglikelihoods, generate, pair_ids, window
from trainflow.evaluate.tasks import TaskError
from trainflow.model import Llama


class TrainflowLM(LM):
    """One single-device model and its tokenizer; `task` names the task in errors."""

    def __init__(self, model: Llama, tokenizer: Tokenizer, task: str, *, max_new_tokens: int) -> None:
        super().__init__()
        self.model, self.tokenizer, self.task, self.max_new_tokens = model, tokenizer, task, max_new_tokens

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        """Each (context, continuation) request's log-likelihood and is_greedy (score.batched_loglikelihoods)."""
        pairs = [pair_ids(self.tokenizer, *r.args) for r in requests]
        if long := next((len(c) for _, c in pairs if len(c) > window(self.model)), None):
            raise TaskError(
                f"task {self.task!r} has a continuation of {long} tokens, more than the model's seq_len"
                f"({window(self.model)}); give a task with shorter answers"
            )
        return batched_loglikelihoods(self.model, pairs)

    def generate_until(self, requests) -> list[str]:
        """Each (context, generation settings) request's greedy continuation, cut before its first `until` string."""
        out = []
        for r in requests:
            context, settings = r.args
            if settings.get("do_sample") or float(settings.get("temperature") or 0) > 0:
                raise TaskError(
                    f"task {self.task!r} asks to sample ({settings}); trainflow generates greedily: give the task "
                    "do_sample: false and temperature: 0"
                )
            until = settings.get("until") or ()
            stops = (until,) if isinstance(until, str) else tuple(until)
            limit = int(settings.get("max_gen_toks") or self.max_new_tokens)
            out.append(generate(self.model, self.tokenizer, context, max_new_tokens=limit, stop=stops))
        return out

    def loglikelihood_rolling(self, requests) -> list[float]:
        """Perplexity tasks are refused before any request (harness.SCORED): the evaluate stage's validation losses
        are the run's perplexity."""
        raise TaskError(f"task {self.task!r} asks for a rolling log-likelihood; trainflow does not score perplexity")
