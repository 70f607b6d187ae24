"""The Python safetensors writer and reader, and the C++ reader on the writer's files (docs/formats.md §3.1).

The cross-language tests run $DZ_BUILD_DIR/tests/dz_st_dump (tests/tools/st_dump.cpp), which prints
each tensor's name, dtype, shape and the FNV-1a hash of its bytes as read by dz::formats. They fail,
not skip, when the tool is missing.
"""

import json
import os
import struct
import subprocess
import tempfile
import unittest

import torch

from dayzero_ref import safetensors_io as st


def fnv1a64(data):
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


def random_raw(generator, dtype, shape):
    num_bytes = st.num_bytes(dtype, shape)
    data = torch.randint(0, 256, (num_bytes,), generator=generator, dtype=torch.uint8)
    return st.RawTensor(dtype, tuple(shape), data.numpy().tobytes())


def random_torch(generator, dtype, shape):
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype) + 0.5
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=generator, dtype=torch.int64).to(dtype)


# A shape per tag with whole bytes, including sub-byte tags (F4: 6 x 4 bits, F6: 4 x 6 bits).
SHAPES = {"F4": (2, 3), "F6_E2M3": (4,), "F6_E3M2": (2, 2)}


class WriterReaderTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.generator = torch.Generator().manual_seed(20251130)

    def tearDown(self):
        self.tmp.cleanup()

    def test_round_trips_every_dtype_tag(self):
        tensors = {f"t.{tag.lower()}": random_raw(self.generator, tag, SHAPES.get(tag, (3, 5)))
                   for tag in st.DTYPE_BITS}
        path = os.path.join(self.dir, "all.safetensors")
        st.save_file(path, tensors, metadata={"format": "pt", "note": "ü"})
        loaded = st.load_file(path)
        self.assertEqual(set(loaded), set(tensors))
        for name, r in tensors.items():
            self.assertEqual(loaded[name], r, name)
        self.assertEqual(st.load_metadata(path), {"format": "pt", "note": "ü"})

    def test_round_trips_torch_tensors(self):
        shapes = [(4, 7), (1,), (), (0, 3), (2, 3, 5)]
        for dtype in [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.uint8,
                      torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
                      torch.complex64]:
            tensors = {f"x{i}": random_torch(self.generator, dtype, shape)
                       for i, shape in enumerate(shapes)}
            path = os.path.join(self.dir, "t.safetensors")
            st.save_file(path, tensors)
            loaded = st.load_file(path)
            for name, t in tensors.items():
                back = st.to_torch(loaded[name])
                self.assertEqual(back.dtype, dtype)
                self.assertEqual(back.shape, t.shape)
                self.assertTrue(torch.equal(back, t), f"{dtype} {name}")

    def test_tags_float8_codes(self):
        codes = torch.randint(0, 256, (4, 8), generator=self.generator, dtype=torch.uint8)
        r = st.raw(codes, "F8_E4M3")
        self.assertEqual(r.dtype, "F8_E4M3")
        self.assertEqual(r.shape, (4, 8))
        self.assertEqual(r.data, codes.numpy().tobytes())
        self.assertTrue(torch.equal(st.to_torch(r), codes))
        with self.assertRaisesRegex(ValueError, "element widths differ"):
            st.raw(torch.ones(2), "F8_E4M3")

    def test_refuses_inconsistent_raw_tensors(self):
        path = os.path.join(self.dir, "bad.safetensors")
        with self.assertRaisesRegex(ValueError, "3 bytes, shape \\[2\\] x F16 needs 4"):
            st.save_file(path, {"a": st.RawTensor("F16", (2,), b"abc")})
        with self.assertRaisesRegex(ValueError, "not whole bytes"):
            st.save_file(path, {"a": st.RawTensor("F4", (3,), b"ab")})
        with self.assertRaisesRegex(ValueError, "unknown safetensors dtype"):
            st.save_file(path, {"a": st.RawTensor("F7", (1,), b"a")})

    def test_lays_files_out_like_the_reference_library(self):
        tensors = {"b": random_raw(self.generator, "U8", (3,)),
                   "a": random_raw(self.generator, "F32", (5,)),
                   "c": random_raw(self.generator, "BF16", (3,)),
                   "d": random_raw(self.generator, "I64", (1,))}
        path = os.path.join(self.dir, "layout.safetensors")
        st.save_file(path, tensors)
        with open(path, "rb") as f:
            blob = f.read()
        (header_bytes,) = struct.unpack("<Q", blob[:8])
        self.assertEqual(header_bytes % 8, 0)
        header_text = blob[8:8 + header_bytes].decode()
        self.assertEqual(header_text, header_text.rstrip() + " " * (len(header_text) -
                                                                    len(header_text.rstrip())))
        header = json.loads(header_text)
        # Widest first, then by name: each tensor is aligned to its element size.
        self.assertEqual(list(header), ["d", "a", "c", "b"])
        for name, entry in header.items():
            element_bytes = st.DTYPE_BITS[entry["dtype"]] // 8
            self.assertEqual((8 + header_bytes + entry["data_offsets"][0]) % element_bytes, 0, name)

    def test_writes_deterministic_bytes(self):
        tensors = {f"w{i}": random_raw(self.generator, "BF16", (i + 1, 2)) for i in range(5)}
        first, second = (os.path.join(self.dir, n) for n in ("1.safetensors", "2.safetensors"))
        st.save_file(first, tensors)
        st.save_file(second, dict(reversed(list(tensors.items()))))
        with open(first, "rb") as f1, open(second, "rb") as f2:
            self.assertEqual(f1.read(), f2.read())

    def test_shards_by_size(self):
        tensors = {f"layer.{i}.w": random_raw(self.generator, "F32", (i + 2,)) for i in range(6)}
        tensors["big"] = random_raw(self.generator, "U8", (100,))
        out = os.path.join(self.dir, "ckpt")
        paths = st.save_sharded(out, tensors, max_shard_bytes=40, metadata={"format": "pt"})
        names = [os.path.basename(p) for p in paths]
        self.assertEqual(names, [st.shard_file_name(i, len(paths)) for i in range(len(paths))])
        self.assertEqual(names[0], f"model-00001-of-{len(paths):05d}.safetensors")
        with open(os.path.join(out, st.INDEX_FILE_NAME)) as f:
            index = json.load(f)
        self.assertEqual(index["metadata"]["total_size"], sum(len(r.data) for r in tensors.values()))
        self.assertEqual(set(index["weight_map"]), set(tensors))
        seen = {}
        for path in paths:
            loaded = st.load_file(path)
            self.assertLessEqual(sum(len(r.data) for r in loaded.values()),
                                 max(40, max(len(r.data) for r in loaded.values())))
            self.assertEqual(st.load_metadata(path), {"format": "pt"})
            for name, r in loaded.items():
                self.assertEqual(index["weight_map"][name], os.path.basename(path))
                seen[name] = r
        self.assertEqual(seen, tensors)
        # The 100-byte tensor is larger than a shard and sits alone.
        self.assertEqual(list(st.load_file(os.path.join(out, index["weight_map"]["big"]))), ["big"])


class CppReaderTest(unittest.TestCase):
    """The C++ reader (dz::formats) on files the Python writer made."""

    def setUp(self):
        build_dir = os.environ.get("DZ_BUILD_DIR")
        self.assertTrue(build_dir, "DZ_BUILD_DIR is not set (run through ctest)")
        self.tool = os.path.join(build_dir, "tests", "dz_st_dump")
        self.assertTrue(os.access(self.tool, os.X_OK), f"{self.tool} is missing: build dz_st_dump")
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.generator = torch.Generator().manual_seed(7)

    def tearDown(self):
        self.tmp.cleanup()

    def dump(self, path):
        result = subprocess.run([self.tool, path], capture_output=True, text=True, check=False)
        return result.returncode, [json.loads(line) for line in result.stdout.splitlines()], \
            result.stderr

    def expect_same(self, lines, tensors, order):
        self.assertEqual([line["name"] for line in lines], order)
        for line in lines:
            r = tensors[line["name"]]
            self.assertEqual(line["dtype"], r.dtype, line["name"])
            self.assertEqual(tuple(line["shape"]), r.shape, line["name"])
            self.assertEqual(line["fnv1a64"], fnv1a64(r.data), line["name"])

    def test_reads_every_accepted_dtype(self):
        shapes = [(3, 5), (1,), (), (0, 4), (2, 1, 3)]
        tensors = {f"model.{tag.lower()}.{i}": random_raw(self.generator, tag, shape)
                   for tag in st.ACCEPTED_DTYPES for i, shape in enumerate(shapes)}
        tensors["model.bf16.torch"] = st.raw(random_torch(self.generator, torch.bfloat16, (4, 6)))
        path = os.path.join(self.dir, "model.safetensors")
        st.save_file(path, tensors, metadata={"format": "pt", "quant": "none"})
        code, lines, stderr = self.dump(path)
        self.assertEqual(code, 0, stderr)
        self.assertEqual(lines[0], {"metadata": {"format": "pt", "quant": "none"}})
        self.expect_same(lines[1:], tensors, list(st.load_file(path)))

    def test_reads_a_sharded_checkpoint(self):
        tensors = {f"layers.{i}.{kind}": random_raw(self.generator, tag, (i + 1, 3))
                   for i in range(5) for kind, tag in (("w", "F8_E4M3"), ("s", "F32"))}
        out = os.path.join(self.dir, "ckpt")
        paths = st.save_sharded(out, tensors, max_shard_bytes=30)
        self.assertGreater(len(paths), 2)
        code, lines, stderr = self.dump(out)
        self.assertEqual(code, 0, stderr)
        self.expect_same(lines, tensors, sorted(tensors))

    def test_refuses_an_unsupported_dtype_by_name(self):
        path = os.path.join(self.dir, "f64.safetensors")
        st.save_file(path, {"ok": random_raw(self.generator, "F32", (2,)),
                            "bad.scale": random_raw(self.generator, "F8_E4M3FNUZ", (4,))})
        code, _, stderr = self.dump(path)
        self.assertEqual(code, 1)
        self.assertIn(f'{path}: tensor "bad.scale": unsupported dtype F8_E4M3FNUZ', stderr)
        self.assertIn("(unsupported)", stderr)

    def test_both_readers_refuse_a_truncated_file(self):
        path = os.path.join(self.dir, "cut.safetensors")
        st.save_file(path, {"w": random_raw(self.generator, "BF16", (8,))})
        with open(path, "rb") as f:
            blob = f.read()
        with open(path, "wb") as f:
            f.write(blob[:-2])
        code, _, stderr = self.dump(path)
        self.assertEqual(code, 1)
        self.assertIn('tensor "w": data_offsets [0, 16] run past the end of the data buffer '
                      '(14 bytes)', stderr)
        with self.assertRaises(ValueError):
            st.load_file(path)


if __name__ == "__main__":
    unittest.main()
