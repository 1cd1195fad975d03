#!/usr/bin/python3
"""Writes the checkpoint fixtures of engine/ckpt and `voxpipe import` (testdata/ckpt/).

Run by hand with Debian's torch (apt-get install python3-torch), from the repository root:

    /usr/bin/python3 tools/ckptgen/gen.py [--golden ../shared/golden] [--out testdata/ckpt]

It writes, all with torch's own serialisers (the files the readers must understand are the
ones torch writes, not a re-implementation of them):

formats/   small files covering the reader's cases, with expected.json (names, dtypes,
           shapes, values) for the Go test:
             state_dict.pt   torch.save zip: {'model': OrderedDict}, F32/F16/BF16, an int64
                             num_batches_tracked, a view at a storage offset, shared storage
             legacy.pt       the same object with _use_new_zipfile_serialization=False
             script.pt       torch.jit.script of nested modules (parameters, buffers, a
                             ModuleList, a plain tensor attribute) plus a traced constant
             noncontig.pt    a transposed (non-contiguous) tensor: refused when read
meanvc2/   the MeanVC2 originals the golden meanvc2 model was packaged from, rebuilt from
           the golden model's own tensors under the published names:
             fastu2pp_160ms.pt         TorchScript: encoder.* with conv_module.streaming_conv
                                       (golden values), non_streaming_conv, global_cmvn,
                                       pos_enc.pe, decoder.* and ctc.* (values not used)
             vocos.pt                  TorchScript: backbone.*, head.out, head.istft.window
             wavlm_large_finetune.pth  torch.save zip {'model': state_dict}: WavLM under
                                       feature_extract.model.* (unilm names, conv LayerNorm
                                       as conv_layers.N.2.1.*), the ECAPA head with BN
                                       num_batches_tracked
           (the DiT safetensors is written by the Go test itself: the format is simple).

The golden model is read with the small GGUF reader below (F32 tensors only).
"""

import argparse
import collections
import json
import os
import struct
import sys

import numpy as np
import torch


# ---- a minimal GGUF reader (F32 tensors, audio.cpp logical names) ----

def read_gguf(path):
    data = open(path, "rb").read()
    off = 0

    def take(fmt):
        nonlocal off
        v = struct.unpack_from("<" + fmt, data, off)
        off += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal off
        n = take("Q")
        s = data[off:off + n].decode("utf-8")
        off += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert data[:4] == b"GGUF", path
    off = 4
    take("I")
    nt, nkv = take("Q"), take("Q")
    kv = {}
    for _ in range(nkv):
        k = string()
        kv[k] = value(take("I"))
    infos = []
    for _ in range(nt):
        name = string()
        nd = take("I")
        dims = [take("Q") for _ in range(nd)]
        typ, toff = take("I"), take("Q")
        infos.append((name, dims, typ, toff))
    align = kv.get("general.alignment", 32)
    base = (off + align - 1) // align * align
    names = kv.get("audiocpp.tensor_names")
    ranks = kv.get("audiocpp.tensor_ranks")
    shapes = kv.get("audiocpp.tensor_shapes")
    out = collections.OrderedDict()
    pos = 0
    for i, (name, dims, typ, toff) in enumerate(infos):
        assert typ == 0, "only F32 golden tensors are read"
        shape = list(reversed(dims))
        if names is not None:
            name = names[i]
            shape = shapes[pos:pos + ranks[i]]
            pos += ranks[i]
        n = int(np.prod(shape)) if shape else 1
        a = np.frombuffer(data, dtype="<f4", count=n, offset=base + toff).reshape(shape)
        out[name] = torch.from_numpy(a.copy())
    return out


# ---- module trees for TorchScript ----

class Node(torch.nn.Module):
    """A module holding parameters, buffers and submodules under given names (no forward)."""


def tree(named, buffers=()):
    root = Node()
    for name, t in named.items():
        parts = name.split(".")
        m = root
        for p in parts[:-1]:
            if p not in m._modules:
                m.add_module(p, Node())
            m = m._modules[p]
        if name in buffers:
            m.register_buffer(parts[-1], t.clone())
        else:
            m.register_parameter(parts[-1], torch.nn.Parameter(t.clone(), requires_grad=False))
    return root


def save_script(named, path, buffers=()):
    torch.jit.script(tree(named, buffers)).save(path)


def sub(tensors, ns):
    p = ns + "/"
    return collections.OrderedDict((k[len(p):], v) for k, v in tensors.items() if k.startswith(p))


# ---- fixtures ----

def formats(out):
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    base = torch.randn(24, generator=g)
    sd = collections.OrderedDict()
    sd["conv.weight"] = torch.randn(4, 2, 3, generator=g)
    sd["conv.bias"] = torch.randn(4, generator=g).half()
    sd["norm.weight"] = torch.randn(5, generator=g).bfloat16()
    sd["norm.num_batches_tracked"] = torch.tensor(17, dtype=torch.int64)
    sd["view.offset"] = base[4:10]            # a view 4 elements into a shared storage
    sd["view.whole"] = base.view(2, 3, 4)     # the same storage, offset 0
    sd["scalar"] = torch.tensor(2.5)
    obj = {"model": sd, "epoch": 3, "note": "fixture", "lr": 0.5, "flags": [True, None]}
    torch.save(obj, os.path.join(out, "state_dict.pt"))
    torch.save(obj, os.path.join(out, "legacy.pt"), _use_new_zipfile_serialization=False)
    torch.save({"t": torch.arange(6.0).reshape(2, 3).t()}, os.path.join(out, "noncontig.pt"))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.register_buffer("win", torch.hann_window(4))

        def forward(self, x):
            return self.lin(x) + self.win.sum()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Conv1d(2, 3, 3)
            self.blocks = torch.nn.ModuleList([Block(), Block()])
            self.gamma = torch.nn.Parameter(torch.full((3,), 0.125))
            self.training_steps = 5

        def forward(self, x):
            x = self.embed(x)
            for b in self.blocks:
                x = b(x)
            return x * torch.tensor([1.0, 2.0, 3.0])

    torch.manual_seed(3)
    net = Net().eval()
    script = torch.jit.script(net)
    script.save(os.path.join(out, "script.pt"))
    traced = torch.jit.trace(net, torch.zeros(1, 2, 5))
    traced.save(os.path.join(out, "traced.pt"))

    def describe(d, prefix=""):
        rows = []
        for k, v in d.items():
            if isinstance(v, torch.Tensor):
                c = v.contiguous()
                vals = c.float().flatten().tolist() if c.is_floating_point() else None
                rows.append({"name": prefix + k, "dtype": str(v.dtype).replace("torch.", ""),
                             "shape": list(v.shape), "values": vals})
        return rows

    expected = {
        "state_dict.pt": describe(sd, "model."),
        "legacy.pt": describe(sd, "model."),
        "script.pt": describe(net.state_dict()),
        "traced.pt": describe(net.state_dict()),
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)


def meanvc2(golden, out):
    os.makedirs(out, exist_ok=True)
    t = read_gguf(os.path.join(golden, "meanvc2", "model.gguf"))
    g = torch.Generator().manual_seed(11)

    # ASR: the golden encoder as Fast-U2++ names it, plus what the converter must drop.
    asr = collections.OrderedDict()
    for k, v in sub(t, "asr").items():
        asr[k] = v
        if ".conv_module.streaming_conv." in k:
            asr[k.replace("streaming_conv", "non_streaming_conv")] = torch.randn(v.shape, generator=g)
    d = asr["encoder.after_norm.weight"].shape[0]
    asr["encoder.global_cmvn.mean"] = torch.randn(80, generator=g)
    asr["encoder.global_cmvn.istd"] = torch.rand(80, generator=g) + 0.5
    asr["encoder.embed.pos_enc.pe"] = torch.randn(1, 16, d, generator=g)
    asr["decoder.embed.0.weight"] = torch.randn(10, d, generator=g)
    asr["ctc.ctc_lo.weight"] = torch.randn(10, d, generator=g)
    asr["ctc.ctc_lo.bias"] = torch.randn(10, generator=g)
    save_script(asr, os.path.join(out, "fastu2pp_160ms.pt"),
                buffers={"encoder.global_cmvn.mean", "encoder.global_cmvn.istd", "encoder.embed.pos_enc.pe"})

    vocos = sub(t, "vocos")
    save_script(vocos, os.path.join(out, "vocos.pt"), buffers={"head.istft.window"})

    # Speaker: WavLM (unilm names under s3prl's feature_extract.model) + ECAPA head.
    sd = collections.OrderedDict()
    for k, v in sub(t, "speaker_wavlm").items():
        parts = k.split(".")
        if k.startswith("feature_extractor.conv_layers.") and parts[3] == "2":
            k = ".".join(parts[:4] + ["1"] + parts[4:])   # ...N.2.{w,b} -> ...N.2.1.{w,b}
        sd["feature_extract.model." + k] = v
    for k, v in sub(t, "speaker_ecapa").items():
        sd[k] = v
        if k.endswith(".running_var"):
            sd[k[:-len("running_var")] + "num_batches_tracked"] = torch.tensor(1000, dtype=torch.int64)
    torch.save({"model": sd}, os.path.join(out, "wavlm_large_finetune.pth"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", default=os.path.join("..", "shared", "golden"))
    ap.add_argument("--out", default=os.path.join("testdata", "ckpt"))
    a = ap.parse_args()
    formats(os.path.join(a.out, "formats"))
    meanvc2(a.golden, os.path.join(a.out, "meanvc2"))
    total = 0
    for root, _, files in os.walk(a.out):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    print(f"wrote {a.out}: {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
