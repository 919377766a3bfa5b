#!/usr/bin/env python3
"""Unit tests of the training pipeline's pieces (CPU, a few seconds; needs torch + transformers).

  python3 -m pytest tools/train/test_train.py      (or: python3 tools/train/test_train.py)
"""
import math
import os
import sys
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_corpus  # noqa: E402
import train  # noqa: E402

kCfg = {"vocab_size": 97, "hidden_size": 48, "intermediate_size": 80, "num_layers": 2,
        "num_heads": 6, "num_kv_heads": 2, "head_dim": 16, "rope_theta": 123456.0,
        "rms_norm_eps": 1e-5, "init_std": 0.05, "bos_id": 95}


def make_model(seed=0):
    torch.manual_seed(seed)
    m = train.LlamaLM(kCfg)
    train.init_weights(m, kCfg["init_std"], kCfg["num_layers"])
    with torch.no_grad():  # norms away from 1 so their weights matter
        for n, p in m.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return m.eval()


def hf_model(m):
    from transformers import LlamaConfig, LlamaForCausalLM
    hf = LlamaForCausalLM(LlamaConfig(**train.hf_config_dict(kCfg, 95, 96, 512)))
    missing, unexpected = hf.load_state_dict(m.state_dict(), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return hf.eval()


class ModelParityTest(unittest.TestCase):
    def test_logits_match_transformers_llama(self):
        m = make_model()
        hf = hf_model(m)
        ids = torch.randint(0, kCfg["vocab_size"], (2, 70))
        with torch.no_grad():
            a = m(ids)
            b = hf(input_ids=ids).logits
        self.assertEqual(a.shape, (2, 70, kCfg["vocab_size"]))
        self.assertLess((a - b).abs().max().item(), 1e-4)

    def test_kv_expansion_path_matches(self):
        m = make_model(1)
        ids = torch.randint(0, kCfg["vocab_size"], (1, 33))
        with torch.no_grad():
            a = m(ids)
            train.gUseSdpaGqa = False
            try:
                b = m(ids)
            finally:
                train.gUseSdpaGqa = True
        self.assertLess((a - b).abs().max().item(), 1e-5)

    def test_parity_check_detects_wrong_head_grouping(self):
        # Swapping two KV heads of one layer must change the logits (the check is not vacuous).
        m = make_model(2)
        hf = hf_model(m)
        with torch.no_grad():
            w = hf.model.layers[0].self_attn.k_proj.weight
            hd = kCfg["head_dim"]
            w.copy_(torch.cat([w[hd:2 * hd], w[:hd]]))
            ids = torch.randint(0, kCfg["vocab_size"], (1, 40))
            diff = (m(ids) - hf(input_ids=ids).logits).abs().max().item()
        self.assertGreater(diff, 1e-3)

    def test_param_count_matches_module(self):
        m = make_model()
        self.assertEqual(train.count_params(kCfg)["total"],
                         sum(p.numel() for p in m.parameters()))


class EvalTest(unittest.TestCase):
    def test_windows_score_every_token_but_the_first_once(self):
        for n, t in [(10, 4), (9, 4), (2, 4), (17, 16), (100, 7)]:
            scored = []
            for s, length in train.eval_windows(n, t):
                self.assertLessEqual(length, t)
                scored.extend(range(s + 1, s + length + 1))
            self.assertEqual(scored, list(range(1, n)), (n, t))

    def test_uniform_model_has_vocab_perplexity(self):
        v = 50
        tokens = np.random.default_rng(0).integers(0, v, 300).astype(np.uint16)
        res = train.heldout_nll(lambda ids: torch.zeros(*ids.shape, v), tokens, 64, "cpu")
        s = train.summarize_nll(res)
        self.assertEqual(s["tokens"], 299)
        self.assertAlmostEqual(s["ppl"], v, delta=1e-4)
        self.assertEqual(s["windows"], math.ceil(299 / 64))

    def test_perfect_model_has_perplexity_one(self):
        tokens = np.arange(200, dtype=np.uint16) % 40

        def oracle(ids):
            logits = torch.full((*ids.shape, 40), -1e4)
            logits.scatter_(-1, ((ids + 1) % 40).unsqueeze(-1), 0.0)
            return logits
        s = train.summarize_nll(train.heldout_nll(oracle, tokens, 32, "cpu"))
        self.assertAlmostEqual(s["ppl"], 1.0, places=6)


class SamplerTest(unittest.TestCase):
    def test_windows_are_slices_and_snap_to_document_starts(self):
        tokens = np.arange(5000, dtype=np.uint16)
        starts = np.array([0, 700, 1500, 4000], dtype=np.int64)
        s = train.WindowSampler(tokens, starts, 256, 16, 1.0, 0, "cpu")
        for _ in range(5):
            x, y = s.next()
            self.assertEqual(x.shape, (16, 256))
            self.assertTrue(torch.equal(y, x + 1))
            for row in x[:, 0].tolist():
                self.assertTrue(row in starts or row == 5000 - 257, row)

    def test_seeded(self):
        tokens = np.arange(3000, dtype=np.uint16)
        starts = np.array([0], dtype=np.int64)
        a = train.WindowSampler(tokens, starts, 64, 4, 0.5, 7, "cpu").next()[0]
        b = train.WindowSampler(tokens, starts, 64, 4, 0.5, 7, "cpu").next()[0]
        self.assertTrue(torch.equal(a, b))


class CorpusTest(unittest.TestCase):
    def test_html_to_text(self):
        html = ("<html><head><title>T</title><script>x=1</script></head><body>"
                "<div class='navheader'><a>Prev</a> <a>Next</a></div>"
                "<h1>Title</h1><p>Some   <b>bold</b>\n text.</p>"
                "<ul><li><p>one</p></li><li>two</li></ul>"
                "<pre>  indented\n    more</pre><p>a &amp; b</p></body></html>")
        self.assertEqual(build_corpus.html_to_text(html),
                         "Title\n\nSome bold text.\n\n- one\n\n- two\n\n  indented\n    more\n\n"
                         "a & b\n")

    def test_clean_text(self):
        self.assertEqual(build_corpus.clean_text("a \r\nb\x00\n\n\n\nc\x0c"), "a\nb\n\nc\n")

    def test_group_units(self):
        k = build_corpus.kGroupChars
        units = [(f"u{i}", "x" * (k // 3)) for i in range(10)]
        docs = build_corpus.group_units(units, "p/")
        self.assertEqual([d[0] for d in docs], ["p/u0..u2", "p/u3..u5", "p/u6..u9"])
        self.assertEqual(sum(len(t) for _, t in docs), 10 * (k // 3) + 10 - len(docs))


if __name__ == "__main__":
    unittest.main()
