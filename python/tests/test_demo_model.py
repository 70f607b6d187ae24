"""The shipped demo model (models/demo, docs/demo_model.md) end to end, as issue 7 asks:

1. Held-out perplexity from the engine (`dayzero perplexity`, run WITHOUT --model, so through the
   default-model resolution) on two 256-token windows of a held-out Brown document
   (tests/data/demo/excerpt.txt) equals the PyTorch reference's (dayzero_ref.hybrid) within 1 %,
   and is at least 3x lower than an add-one unigram model over the same tokenizer and tokens.
2. Sparse attention (index_topk 64 of 256 positions) costs at most 3 % held-out loss against the
   same checkpoint with index_topk raised to 4096, both run by the engine.
3. Greedy generation: `dayzero generate --prompts-file`, temperature 0 (and repetition penalty 1:
   generation_config.json's 1.1 would otherwise apply), 64 tokens for 5 fixed
   prompts, equals greedy decoding in the reference. Checked by teacher forcing: one reference
   forward over prompt + the engine's tokens must pick every engine token as its argmax (by
   induction the same as generating in the reference). Near-ties cannot fail it (docs/models.md §8.1):
   a step where the engine's token differs is accepted when the reference ranks the two
   tokens within TIE_TOL (the engine-reference logit difference), or when a discrete decision
   upstream (an expert choice or an index selection) sits at a near-tie: then `dayzero verify`
   over that prefix, which forces the engine's decisions into the reference, must pass with every
   argmax agreeing. Both are reported; any other difference fails. The demo's routing has
   near-ties (an expert gap of 3e-4 in "In the summer of 1960," by step 42), so rounding-level
   changes to the engine can move a prompt onto one.
"""

import json
import math
import os
import re
import tempfile
import unittest

import numpy as np
import torch

from cli_support import SOURCE_DIR, run_dayzero, skip_unless_built
from dayzero_ref import demo_eval
from dayzero_ref.bpe_train import ByteLevelBpe
from dayzero_ref.hybrid import HybridReference

MODEL_DIR = os.path.join(SOURCE_DIR, "models", "demo")
CONTEXT = 256
WINDOWS = 2
PPL_RTOL = 0.01
UNIGRAM_FACTOR = 3.0
SPARSE_LOSS_RTOL = 0.03
GREEDY_TOKENS = 64
# Engine and reference logits differ by ~0.003 (median) and < 0.05 (p99) on this model; a
# disagreement where the reference itself ranks the two tokens closer than this is a near-tie.
TIE_TOL = 0.02
# Chosen with `dayzero_ref.demo_eval margins` from 52 candidates: the engine's greedy tokens equal
# the reference's on all 64 steps, with the reference's top-two gap at least 0.038 on every step
# (docs/demo_model.md lists each prompt's smallest gap).
PROMPTS = (
    "After the war, the",
    "When I was a child,",
    "The road to the village",
    "The church was built in",
    "In the summer of 1960,",
)


def log_softmax_nll(logits, targets):
    logits = logits.double().numpy()
    lp = logits - logits.max(axis=1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(axis=1, keepdims=True))
    return -lp[np.arange(len(targets)), np.asarray(targets)]


class DemoModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        torch.set_num_threads(2)
        cls.tmp = tempfile.TemporaryDirectory()
        cls.tokenizer = ByteLevelBpe.load(os.path.join(MODEL_DIR, "tokenizer.json"))
        text = demo_eval.kExcerpt.read_text(encoding="utf-8")
        cls.ids = cls.tokenizer.encode(text, allow_special=False)[:CONTEXT * WINDOWS]
        cls.ids_file = os.path.join(cls.tmp.name, "ids.txt")
        with open(cls.ids_file, "w", encoding="utf-8") as f:
            f.write(" ".join(map(str, cls.ids)) + "\n")
        cls.ref = HybridReference(MODEL_DIR)
        cls.env = {k: v for k, v in os.environ.items() if k != "DAYZERO_MODEL"}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def perplexity(self, *model_args):
        result = run_dayzero("perplexity", *model_args, "--token-ids-file", self.ids_file,
                             "--context", CONTEXT, "--json")
        self.assertEqual(result.returncode, 0, result.stderr)
        return json.loads(result.stdout)

    def test_perplexity_matches_reference_and_beats_unigram(self):
        engine = self.perplexity()  # no --model: the default demo model
        self.assertEqual(engine["windows"], WINDOWS)
        nll, targets = [], []
        for w in range(WINDOWS):
            window = self.ids[w * CONTEXT:(w + 1) * CONTEXT]
            with torch.no_grad():
                logits = self.ref.forward(window)
            nll.extend(log_softmax_nll(logits[:-1], window[1:]))
            targets.extend(window[1:])
        ref_ppl = math.exp(float(np.mean(nll)))
        counts = json.loads(demo_eval.kUnigram.read_text())["counts"]
        unigram_ppl = math.exp(demo_eval.unigram_nll(counts, targets))
        print(f"\nheld-out perplexity: engine {engine['perplexity']:.3f}, reference {ref_ppl:.3f}, "
              f"unigram {unigram_ppl:.1f} over {len(targets)} tokens")
        self.assertLess(abs(engine["perplexity"] / ref_ppl - 1.0), PPL_RTOL)
        self.assertLess(UNIGRAM_FACTOR * engine["perplexity"], unigram_ppl)

    def test_sparse_loss_close_to_dense(self):
        with open(os.path.join(MODEL_DIR, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        self.assertLess(config["index_topk"], CONTEXT, "the check needs a sparse selection")
        dense_dir = os.path.join(self.tmp.name, "dense")
        os.makedirs(dense_dir)
        for name in os.listdir(MODEL_DIR):
            if name != "config.json":
                os.symlink(os.path.join(MODEL_DIR, name), os.path.join(dense_dir, name))
        config["index_topk"] = 4096
        with open(os.path.join(dense_dir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
        sparse = self.perplexity("--model", MODEL_DIR)
        dense = self.perplexity("--model", dense_dir)
        print(f"\nheld-out loss: sparse {sparse['mean_nll']:.4f}, dense {dense['mean_nll']:.4f}")
        self.assertNotEqual(sparse["mean_nll"], dense["mean_nll"])
        self.assertLess(abs(sparse["mean_nll"] / dense["mean_nll"] - 1.0), SPARSE_LOSS_RTOL)

    def test_greedy_generation_matches_reference(self):
        prompts_file = os.path.join(self.tmp.name, "prompts.jsonl")
        with open(prompts_file, "w", encoding="utf-8") as f:
            for prompt in PROMPTS:
                f.write(json.dumps({"prompt": prompt}) + "\n")
        result = run_dayzero("generate", "--model", MODEL_DIR, "--prompts-file", prompts_file,
                             "--temperature", 0, "--repetition-penalty", 1,
                             "--max-tokens", GREEDY_TOKENS)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        self.assertEqual(len(lines), len(PROMPTS))
        for prompt, line in zip(PROMPTS, lines):
            with self.subTest(prompt=prompt):
                prompt_ids = self.tokenizer.encode(prompt, allow_special=False)
                tokens = line["tokens"]
                self.assertEqual(len(tokens), GREEDY_TOKENS, line)
                argmax, _ = demo_eval.teacher_forced_margins(self.ref, prompt_ids, tokens)
                ties, decision_ties = [], []
                for step, token in enumerate(tokens):
                    if argmax[step] == token:
                        continue
                    with torch.no_grad():
                        row = self.ref.forward(prompt_ids + tokens[:step])[-1]
                    gap = float(row[argmax[step]] - row[token])
                    if gap < TIE_TOL:
                        ties.append(step)
                        continue
                    # A routing or index-selection near-tie upstream moves the logits by more
                    # than rounding: `dayzero verify` forces the engine's decisions into the
                    # reference, which must then agree everywhere, this step's argmax included.
                    verify = run_dayzero("verify", "--model", MODEL_DIR, "--threads", 1,
                                         "--token-ids",
                                         ",".join(map(str, prompt_ids + tokens[:step])))
                    agree = re.search(r"argmax_agree\s+([\d.e+-]+)", verify.stdout)
                    self.assertTrue(verify.returncode == 0 and agree and float(agree.group(1)) == 1.0,
                                    f"step {step}: engine {token}, reference {argmax[step]} (the "
                                    f"reference prefers its token by {gap:.4f}; with the engine's "
                                    f"decisions forced: {verify.stdout[-600:]}{verify.stderr[-600:]})")
                    decision_ties.append(step)
                if ties or decision_ties:
                    print(f"\n{prompt!r}: near-ties at steps {ties}, decision near-ties at steps "
                          f"{decision_ties} (choose the prompts again with dayzero_ref.demo_eval "
                          "margins)")

if __name__ == "__main__":
    unittest.main()
