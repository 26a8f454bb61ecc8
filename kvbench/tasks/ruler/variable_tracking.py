"""RULER's variable tracking (``vt``): chains of ``VAR X = VAR Y`` assignments hidden in noise, with a one-shot
in-context example."""

from __future__ import annotations

import string

from kvbench.tasks.ruler.sizing import Generated, SizedGenerator
from kvbench.tasks.ruler.spec import NOISE_LINE, VT_INSTRUCTION, VT_PREFIX, VT_QUESTION


class VariableTrackingGenerator(SizedGenerator):
    """Variable tracking: which variables end up holding the queried value."""

    def _names(self, count: int, size: int, taken: set[str]) -> list[str]:
        names: list[str] = []
        while len(names) < count:
            name = "".join(self.rng.choices(string.ascii_uppercase, k=size))
            if name not in taken and name != "VAR":
                taken.add(name)
                names.append(name)
        return names

    def _vt_text(self, num_noises: int, size: int, value: str | None) -> tuple[str, list[str], str]:
        """(haystack with the chain(s), names of chain 0, value of chain 0)."""
        a = self.args
        taken: set[str] = set()
        chains: list[list[str]] = []
        first_names: list[str] = []
        first_value = ""
        for j in range(a["num_chains"]):
            names = self._names(a["num_hops"] + 1, size, taken)
            chain_value = value if value is not None else str(self.rng.randint(10000, 99998))
            lines = [f"VAR {names[0]} = {chain_value}"]
            lines += [f"VAR {names[i + 1]} = VAR {names[i]} " for i in range(a["num_hops"])]
            chains.append(lines)
            if j == 0:
                first_names, first_value = names, chain_value
        sentences = [NOISE_LINE] * num_noises
        for chain in chains:
            positions = sorted(self.rng.sample(range(len(sentences)), len(chain)))
            for offset, (pos, line) in enumerate(zip(positions, chain, strict=True)):
                sentences.insert(pos + offset, line)
        haystack = "\n".join(sentences).replace(". \n", ".\n")
        return haystack, first_names, first_value

    def _build_vt_icl_probe(self, num_noises: int) -> Generated:
        haystack, names, value = self._vt_text(num_noises, 3, "12345")
        num_v = self.args["num_hops"] + 1
        return Generated(
            context=VT_INSTRUCTION + haystack + "\n",
            question=VT_QUESTION.format(query=value),
            answer_prefix=VT_PREFIX.format(num_v=num_v, query=value),
            answers=names,
        )

    def _randomized_icl(self) -> str:
        text = self._icl
        for name in self._icl_names:
            text = text.replace(name, "".join(self.rng.choices(string.ascii_uppercase, k=len(name))))
        return text.replace("12345", str(self.rng.randint(10000, 99998)))

    def _build_vt(self, num_noises: int) -> Generated:
        icl = self._randomized_icl() + "\n"
        haystack, names, value = self._vt_text(num_noises, 5, None)
        num_v = self.args["num_hops"] + 1
        return Generated(
            context=icl + VT_INSTRUCTION + haystack + "\n",
            question=VT_QUESTION.format(query=value),
            answer_prefix=VT_PREFIX.format(num_v=num_v, query=value),
            answers=names,
            extra={"_haystack": haystack, "_first_line": f"VAR {names[0]} = {value}"},
        )

    def _generate_vt(self, num_samples: int) -> list[Generated]:
        # One-shot example: a 500-token sample (5-noise-line units, no answer budget), 3-letter names, value 12345.
        # A tokenizer too verbose for even 5 noise lines in 500 tokens (e.g. byte-level) gets the minimal example.
        # The example is sized with the raw task template (no model template), as officially.
        outer = self.length, self.max_new_tokens, self.use_chat_template, self.answer_prefix_mode
        self.length, self.max_new_tokens, self.use_chat_template, self.answer_prefix_mode = 500, 0, False, "user"
        try:
            icl_units = self.search(self._build_vt_icl_probe, 5)
            probe = self.fit_sample(self._build_vt_icl_probe, icl_units, 5)
        except ValueError:
            probe = self._build_vt_icl_probe(self.min_units)
        finally:
            self.length, self.max_new_tokens, self.use_chat_template, self.answer_prefix_mode = outer
        self._icl = probe.context + probe.question + probe.answer_prefix + " " + " ".join(probe.answers) + "\n"
        self._icl_names = probe.answers
        incremental = 10 if self.length >= 4096 else 5
        units = self.search(self._build_vt, incremental)
        out = []
        for _ in range(num_samples):
            sample = self.fit_sample(self._build_vt, units, incremental)
            haystack, line = sample.extra.pop("_haystack"), sample.extra.pop("_first_line")
            sample.extra["depth"] = round(self._depth(haystack, haystack.find(line)), 2)
            out.append(sample)
        return out
