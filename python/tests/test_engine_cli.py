"""`dayzero generate --prompts-file` (and `--prompt`) through the serving engine on the tiny deepseek_v32,
kimi_linear and kimi_k3 checkpoints (docs/serving.md §2–§3).

1. Batched == alone: six prompts of 5–100 tokens (up to 7 blocks of 16) run together with a
   32-token step budget (prefills chunked and mixed with decodes) give the greedy tokens and the
   logits of each prompt run alone (--max-num-seqs 1, whole-prompt prefill, no prefix cache).
   The same prompts sampled (temperature 0.8, a seed per line) give identical tokens: the draw
   depends on (seed, position, logits) only.
2. Prefix cache: prompts sharing a 56-token system prompt (3 full blocks), run one after another,
   with and without --no-prefix-caching, give the same logits and greedy tokens; later prompts
   report cached tokens, and for the hybrid Kimi models a hit is a multiple of the block size (it
   is capped at a recurrent-state checkpoint, taken at every block boundary here).
3. Preemption: a pool of 12 blocks for six requests needing up to 8 each forces preemption and
   recompute; the tokens equal the roomy alone run.
4. Bad prompts-file lines are refused with exit code 1, naming the line and the field.
5. `generate --prompt` is one request of the same engine: the text and tokens of the same prompt
   as a prompts-file line, and a stop string cuts it where the text first contains it.

Tolerances (docs/models.md §8.1): batch composition, chunking and recompute change only the FP32
summation order and which MLA form runs (see test_deepseek_v32_cli.py), so max |a − b| over a
prompt's compared rows < 5e-3 · max |alone|, the split tolerance of the model CLI tests. Tokens
must be identical up to the first position whose top-2 logit margin in the alone run is below
twice that bound (a legitimate near-tie: either token is right); from there on the sequences may
differ and are not compared.
"""

import itertools
import json
import os
import re
import tempfile
import time
import unittest

import numpy as np

from cli_support import SOURCE_DIR, run_dayzero, skip_unless_built
from dayzero_ref import make_tiny


ARCHS = ("deepseek_v32", "kimi_linear", "kimi_k3", "dayzero_hybrid")
HYBRID = ("kimi_linear", "kimi_k3", "dayzero_hybrid")
BLOCK = 16
LENGTHS = (5, 17, 33, 65, 100, 16)
MAX_TOKENS = 12
LOGIT_TOLERANCE = 5e-3  # max |a − b| relative to max |alone|, see the docstring
SAMPLE_TEMPERATURE = 0.8
SYSTEM_LEN = 56  # 3 full blocks and a partial one
DEMO_LOGIT_TOLERANCE = LOGIT_TOLERANCE  # of max |logit|, as for the tiny models
DEMO_PROMPTS = ("Once upon a time there was a little girl", "The weather today is",
                "In 1990 the company", "She opened the door and saw",
                "The history of the city begins", "He said that the best way to learn")


def test_prompt(arch, length):
    """The decisive test prompts of dayzero_ref (docs/models.md §8.1)."""
    # pylint: disable=import-outside-toplevel
    if arch == "deepseek_v32":
        from dayzero_ref import test_prompts as prompts
    else:  # Kimi's (random regular ids) serve dayzero_hybrid too: engine-vs-engine comparisons
        from dayzero_ref import test_prompts_kimi as prompts
    return [int(t) for t in dict(prompts.PROMPTS)[length]]


class EngineCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dirs = {}
        for arch in ARCHS:
            cls.dirs[arch] = os.path.join(cls.tmp.name, f"{arch}-tiny")
            make_tiny.make_tiny(arch, cls.dirs[arch], seed=0)
        cls.alone = {}  # arch -> (outputs, logits) of the prompts of item 1 run alone
        cls.started = time.monotonic()

    @classmethod
    def tearDownClass(cls):
        print(f"\ntest_engine_cli: {time.monotonic() - cls.started:.1f} s")
        cls.tmp.cleanup()

    def generate(self, arch, lines, *flags, name="run"):
        """Runs generate --prompts-file; returns (parsed output lines, logits per prompt, stderr)."""
        prompts = os.path.join(self.tmp.name, f"{arch}-{name}.jsonl")
        with open(prompts, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
        dump = os.path.join(self.tmp.name, f"{arch}-{name}-logits")
        if "--num-blocks" not in flags:  # room for everything, without the default 1 GiB
            flags = (*flags, "--num-blocks", 256)
        if "--temperature" not in flags:  # lines without fields: greedy, no nucleus cut, not
            flags = (*flags, "--temperature", 0, "--top-p", 1)  # generation_config.json's values
        proc = run_dayzero("generate", "--model", self.dirs[arch], "--prompts-file", prompts,
                           "--threads", 1, "--block-size", BLOCK, "--max-tokens", MAX_TOKENS,
                           "--dump-logits", dump, *flags)
        self.assertEqual(proc.returncode, 0, f"{arch} {name}: {proc.stderr}")
        outputs = [json.loads(line) for line in proc.stdout.splitlines()]
        self.assertEqual([o["index"] for o in outputs], list(range(len(lines))))
        logits = [np.load(os.path.join(dump, f"{i}.npy")) for i in range(len(lines))]
        for out, rows in zip(outputs, logits):
            self.assertEqual(out["finish_reason"], "length" if len(out["tokens"]) == MAX_TOKENS
                             else "stop", out)
            self.assertGreaterEqual(rows.shape[0], len(out["tokens"]))
            self.assertTrue(np.isfinite(rows).all())
        return outputs, logits, proc.stderr

    def assert_same_completion(self, what, ours, ref, ours_logits=None, ref_logits=None):
        """Tokens equal up to the first near-tie of the reference; logits within tolerance there."""
        margin_bound = None
        if ref_logits is not None:
            scale = np.abs(ref_logits).max()
            margin_bound = 2 * LOGIT_TOLERANCE * scale
        compared = 0
        for pos, token in enumerate(ref["tokens"]):
            if ours_logits is not None and ref_logits is not None:
                diff = np.abs(ours_logits[pos] - ref_logits[pos]).max()
                self.assertLess(diff, LOGIT_TOLERANCE * scale, f"{what}: logits of token {pos}")
            if margin_bound is not None:
                top2 = np.sort(ref_logits[pos])[-2:]
                if top2[1] - top2[0] < margin_bound:
                    print(f"\n{what}: near-tie at token {pos} (margin {top2[1] - top2[0]:.2e}); "
                          "not compared further")
                    return
            self.assertLess(pos, len(ours["tokens"]), f"{what}: output too short")
            self.assertEqual(ours["tokens"][pos], token, f"{what}: token {pos}")
            compared += 1
        self.assertEqual(len(ours["tokens"]), len(ref["tokens"]), what)

    def assert_same_until_a_near_tie(self, what, ours, ref, ours_logits, ref_logits, tolerance):
        """For a model with small margins (the demo): logits within tolerance · max |ref| on
        every compared row, tokens equal up to the first position where they differ, and there
        the reference's logit gap between the two tokens below twice that bound."""
        scale = np.abs(ref_logits).max()
        worst = 0.0
        for pos, token in enumerate(ref["tokens"]):
            self.assertLess(pos, len(ours["tokens"]), f"{what}: output too short")
            diff = np.abs(ours_logits[pos] - ref_logits[pos]).max()
            worst = max(worst, diff / scale)
            self.assertLess(diff, tolerance * scale, f"{what}: logits of token {pos}")
            if ours["tokens"][pos] != token:
                gap = ref_logits[pos][token] - ref_logits[pos][ours["tokens"][pos]]
                self.assertLess(gap, 2 * tolerance * scale, f"{what}: token {pos} differs")
                print(f"\n{what}: near-tie at token {pos} (gap {gap:.2e}); not compared further")
                return worst
        self.assertEqual(len(ours["tokens"]), len(ref["tokens"]), what)
        return worst

    def assert_same_samples(self, what, ours, ref, ours_logits, ref_logits):
        """Identical tokens. The draw uses the same uniform in both runs, so a token can differ
        only with a probability of sum_j |CDF_ours(j) − CDF_ref(j)| (inverse CDF in id order),
        reported on failure; it stays below 1e-3 here (FP32 reordering only)."""
        if ours["tokens"] == ref["tokens"]:
            return
        pos = next((k for k, (a, b) in enumerate(zip(ours["tokens"], ref["tokens"])) if a != b),
                   min(len(ours["tokens"]), len(ref["tokens"])))
        flip = float("nan")
        if pos < min(len(ours_logits), len(ref_logits)):
            cdfs = []
            for row in (ours_logits[pos], ref_logits[pos]):
                x = row.astype(np.float64) / SAMPLE_TEMPERATURE
                p = np.exp(x - x.max())
                cdfs.append(np.cumsum(p / p.sum()))
            flip = float(np.abs(cdfs[0] - cdfs[1]).sum())
        self.fail(f"{what}: tokens differ from position {pos} (chance of a legitimate flip there "
                  f"{flip:.1e}): {ours['tokens']} vs {ref['tokens']}")

    def prompt_lines(self, arch):
        """Item 1's file: the six prompts greedy, then the same six sampled with their own seeds."""
        ids = [test_prompt(arch, n) for n in LENGTHS]
        greedy = [{"prompt_token_ids": p} for p in ids]
        sampled = [{"prompt_token_ids": p, "temperature": SAMPLE_TEMPERATURE, "seed": 100 + i}
                   for i, p in enumerate(ids)]
        return greedy + sampled

    def alone_run(self, arch):
        if arch not in self.alone:
            outputs, logits, _ = self.generate(arch, self.prompt_lines(arch), "--max-num-seqs", 1,
                                               "--no-prefix-caching", name="alone")
            self.alone[arch] = (outputs, logits)
        return self.alone[arch]

    def test_batched_equals_alone(self):
        for arch in ARCHS:
            with self.subTest(arch=arch):
                ref, ref_logits = self.alone_run(arch)
                ours, ours_logits, stderr = self.generate(
                    arch, self.prompt_lines(arch), "--max-num-batched-tokens", 32,
                    "--max-num-seqs", 16, name="batched")
                print(f"\n{arch} batched: {stderr.strip().splitlines()[-1]}")
                n = len(LENGTHS)
                for i in range(n):
                    self.assertEqual(ours[i]["prompt_tokens"], LENGTHS[i])
                    self.assert_same_completion(f"{arch} greedy prompt {i}", ours[i], ref[i],
                                                ours_logits[i], ref_logits[i])
                for i in range(n, 2 * n):
                    self.assert_same_samples(f"{arch} sampled prompt {i - n}", ours[i], ref[i],
                                             ours_logits[i], ref_logits[i])
                # Sampling really sampled: some sampled output differs from the greedy one. (The
                # tiny deepseek_v32 is too decisive for that at 0.8: p_max >= 0.98 everywhere.)
                if arch in HYBRID:
                    self.assertTrue(any(ref[i]["tokens"] != ref[i + n]["tokens"]
                                        for i in range(n)))

    def test_speculation_equals_plain_decoding(self):
        """Speculative decoding (n-gram drafts, and the MTP head where the checkpoint has one)
        gives plain decoding's tokens: at batch 1 and with 16 sequences of different lengths in
        one batch, for every architecture and the demo model. The reference is the plain run alone; tokens and logits are compared as batched vs
        alone. Drafts get accepted and rejected: prompts P + O + P, with O the plain completion of
        P, let the n-gram proposer draft O again after the second P (the tiny models continue a
        token by its successor, so most of O comes again); prompts P alone draft little."""
        spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3,
                           "prompt_lookup_min": 1, "prompt_lookup_max": 3,
                           "disable_by_batch_size": 16})
        for arch in (*ARCHS, "demo"):
            with self.subTest(arch=arch):
                if arch == "demo":  # text: the trained model copies what it read
                    self.dirs.setdefault("demo", os.path.join(SOURCE_DIR, "models", "demo"))
                    key = "prompt"
                    prompts = list(DEMO_PROMPTS)
                else:
                    key = "prompt_token_ids"
                    prompts = [test_prompt(arch, n) for n in LENGTHS]
                first, _, _ = self.generate(arch, [{key: p} for p in prompts],
                                            "--max-num-seqs", 1, "--no-prefix-caching",
                                            "--repetition-penalty", 1, name="spec-first")
                if arch == "demo":
                    repeated = [f"{p}{o['text']} {p}" for p, o in zip(prompts, first)]
                else:
                    repeated = [p + o["tokens"] + p for p, o in zip(prompts, first)]
                lines = ([{key: p} for p in repeated + prompts]
                         + [{key: p, "temperature": SAMPLE_TEMPERATURE, "seed": 200 + i}
                            for i, p in enumerate(repeated[:4])])
                ref, ref_logits, _ = self.generate(arch, lines, "--max-num-seqs", 1,
                                                   "--no-prefix-caching", "--repetition-penalty",
                                                   1, name="spec-ref")
                runs = {
                    "batch 1": ("--max-num-seqs", 1, "--no-prefix-caching"),
                    "batch 16": ("--max-num-seqs", 16, "--max-num-batched-tokens", 64),
                }
                methods = {"ngram": spec}
                if arch in ("deepseek_v32", "dayzero_hybrid", "demo"):
                    # The checkpoint's MTP layer, chained once: two drafts.
                    methods["mtp"] = json.dumps({"method": "mtp", "num_speculative_tokens": 2,
                                                 "disable_by_batch_size": 16})
                for (what, flags), (method, config) in itertools.product(runs.items(),
                                                                        methods.items()):
                    what = f"{what} {method}"
                    ours, ours_logits, stderr = self.generate(
                        arch, lines, *flags, "--repetition-penalty", 1,
                        "--speculative-config", config, name="spec")
                    summary = stderr.strip().splitlines()[-1]
                    print(f"\n{arch} speculative {what}: {summary}")
                    drafted = re.search(r"speculative: (\d+) drafts, (\d+) draft tokens, "
                                        r"(\d+) accepted \(([\d/]+) by position", summary)
                    self.assertIsNotNone(drafted, summary)
                    draft_tokens, accepted = int(drafted.group(2)), int(drafted.group(3))
                    last = int(drafted.group(4).split("/")[-1])
                    self.assertGreater(accepted, 0, summary)
                    if method == "ngram":
                        self.assertLess(accepted, draft_tokens, summary)  # some rejected
                    if arch != "demo":  # decisive: the same tokens on every CPU
                        self.assertGreater(last, 0, summary)  # some rows accepted whole
                    if arch == "demo":  # small margins; sampled draws move with the rounding
                        worst = max(self.assert_same_until_a_near_tie(
                            f"{arch} {what} prompt {i}", ours[i], ref[i], ours_logits[i],
                            ref_logits[i], DEMO_LOGIT_TOLERANCE) for i in range(12))
                        print(f"demo {what}: worst logit difference {worst:.2e} of max |logit|")
                        continue
                    for i in range(12):
                        self.assert_same_completion(f"{arch} {what} prompt {i}", ours[i], ref[i],
                                                    ours_logits[i], ref_logits[i])
                    for i in range(12, 16):
                        self.assert_same_samples(f"{arch} {what} sampled prompt {i}", ours[i],
                                                 ref[i], ours_logits[i], ref_logits[i])

    def test_prefix_cache_hit_equals_cold_run(self):
        for arch in ARCHS:
            with self.subTest(arch=arch):
                system = test_prompt(arch, 64)[:SYSTEM_LEN]
                suffixes = [test_prompt(arch, n) for n in (5, 17, 15, 16)]
                lines = [{"prompt_token_ids": system + s} for s in suffixes]
                # A checkpoint at every block boundary, and slots enough to keep them all.
                flags = ("--max-num-seqs", 1, "--state-checkpoint-interval", BLOCK,
                         "--max-state-checkpoints", 32)
                warm, warm_logits, stderr = self.generate(arch, lines, *flags, name="warm")
                cold, cold_logits, _ = self.generate(arch, lines, *flags, "--no-prefix-caching",
                                                     name="cold")
                print(f"\n{arch} prefix cache: {stderr.strip().splitlines()[-1]}; cached "
                      f"{[o['cached_tokens'] for o in warm]}")
                for i, (w, c) in enumerate(zip(warm, cold)):
                    self.assertEqual(c["cached_tokens"], 0)
                    self.assertLessEqual(w["cached_tokens"], w["prompt_tokens"] - 1)
                    if i > 0:
                        self.assertGreaterEqual(w["cached_tokens"], 3 * BLOCK, w)
                    if arch in HYBRID:
                        self.assertEqual(w["cached_tokens"] % BLOCK, 0, w)
                    self.assert_same_completion(f"{arch} shared-prefix prompt {i}", w, c,
                                                warm_logits[i], cold_logits[i])

    def test_preemption_gives_the_same_tokens(self):
        for arch in ARCHS:
            with self.subTest(arch=arch):
                ref, ref_logits = self.alone_run(arch)
                n = len(LENGTHS)
                ours, _, stderr = self.generate(arch, self.prompt_lines(arch)[:n], "--num-blocks",
                                                12, "--max-num-seqs", 4,
                                                "--max-num-batched-tokens", 32, name="tiny")
                print(f"\n{arch} tiny pool: {stderr.strip().splitlines()[-1]}; preemptions "
                      f"{[o['preemptions'] for o in ours]}")
                self.assertGreater(sum(o["preemptions"] for o in ours), 0)
                for i in range(n):
                    self.assert_same_completion(f"{arch} preempted prompt {i}", ours[i], ref[i],
                                                None, ref_logits[i])

    def test_sampling_defaults_come_from_generation_config(self):
        """Sampling flags left out take generation_config.json's values, as the server's missing
        request fields do: no flags samples exactly as the checkpoint's values given as flags."""
        arch = "deepseek_v32"
        with open(os.path.join(self.dirs[arch], "generation_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        self.assertGreater(config.get("temperature", 0), 0, config)
        base = ("generate", "--model", self.dirs[arch], "--prompt", "hello world", "--threads", 1,
                "--max-tokens", MAX_TOKENS, "--num-blocks", 256, "--seed", 11, "--ignore-eos",
                "--timing")
        explicit = []
        for flag, key in (("--temperature", "temperature"), ("--top-p", "top_p"),
                          ("--top-k", "top_k"), ("--min-p", "min_p"),
                          ("--repetition-penalty", "repetition_penalty")):
            if key in config:
                explicit += [flag, config[key]]
        runs = [run_dayzero(*base), run_dayzero(*base, *explicit)]
        for proc in runs:
            self.assertEqual(proc.returncode, 0, proc.stderr)
        tokens = [[json.loads(line) for line in proc.stderr.splitlines()
                   if line.startswith("{")][0]["tokens"] for proc in runs]
        self.assertEqual(tokens[0], tokens[1])
        self.assertEqual(runs[0].stdout, runs[1].stdout)

    def test_prompt_is_one_request_of_the_same_engine(self):
        """generate --prompt runs the path of --prompts-file: the same text and tokens, greedy
        and sampled, a stop string cut the same way."""
        for arch in ("deepseek_v32", "kimi_k3"):
            for flags in (("--temperature", 0), ("--temperature", 0.8, "--seed", 3)):
                with self.subTest(arch=arch, flags=flags):
                    batch, _, _ = self.generate(arch, [{"prompt": "hello world"}], *flags,
                                                name="one")
                    proc = run_dayzero("generate", "--model", self.dirs[arch], "--prompt",
                                       "hello world", "--threads", 1, "--block-size", BLOCK,
                                       "--max-tokens", MAX_TOKENS, "--num-blocks", 256,
                                       "--timing", *flags)
                    self.assertEqual(proc.returncode, 0, proc.stderr)
                    self.assertEqual(proc.stdout, batch[0]["text"] + "\n")
                    timing = [json.loads(line) for line in proc.stderr.splitlines()
                              if line.startswith("{")]
                    self.assertEqual(timing[0]["tokens"], batch[0]["tokens"])
                    text = batch[0]["text"]
                    if len(text) < 2:
                        continue
                    stop = text[len(text) // 2:][:2]
                    cut = run_dayzero("generate", "--model", self.dirs[arch], "--prompt",
                                      "hello world", "--threads", 1, "--block-size", BLOCK,
                                      "--max-tokens", MAX_TOKENS, "--num-blocks", 256,
                                      "--stop", stop, *flags)
                    self.assertEqual(cut.returncode, 0, cut.stderr)
                    self.assertEqual(cut.stdout, text[:text.index(stop)] + "\n")

    def test_bad_prompts_file_lines(self):
        arch = "kimi_k3"
        good = '{"prompt": "hello"}\n'
        cases = [
            (good + '{"prompt": "x"\n', "line 2: not valid JSON"),
            (good + '{"promt": "x"}\n', 'line 2: unknown field "promt"'),
            ('\n' + good + '{"prompt": "x", "temperature": "hot"}\n',
             'line 3: field "temperature": expected a number, found "hot"'),
            ('{"prompt": "x", "prompt_token_ids": [1]}\n', "line 1: give exactly one"),
            ('{"prompt_token_ids": [1, -2]}\n', 'line 1: field "prompt_token_ids"'),
            ('{"prompt": "x", "max_tokens": 0}\n', 'line 1: field "max_tokens"'),
            ('{"prompt": "x", "top_p": 0}\n', "line 1: top_p"),
            ('[1, 2]\n', "line 1: expected a JSON object"),
            ('{"prompt_token_ids": [1, 100000]}\n', "line 1"),
            ("", "no prompts"),
        ]
        path = os.path.join(self.tmp.name, "bad.jsonl")
        for text, message in cases:
            with self.subTest(text=text):
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                proc = run_dayzero("generate", "--model", self.dirs[arch], "--prompts-file", path,
                                   "--threads", 1, "--num-blocks", 64)
                self.assertEqual(proc.returncode, 1, proc.stderr)
                self.assertIn(message, proc.stderr)
                self.assertEqual(proc.stdout, "")


if __name__ == "__main__":
    unittest.main()
