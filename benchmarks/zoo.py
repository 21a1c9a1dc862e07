"""Real models, side by side in one run: torchvision and torch models exported with
`torch.onnx.export` (random weights), run through `tilec.onnx.load` and compared with
onnxruntime (the outputs) and torch eager in fp32 with TF32 off (the time).

    python benchmarks/zoo.py export DIR [--only NAME,..]           # needs torch, torchvision
    python benchmarks/zoo.py export DIR --graph-only               # weights left out (below)
    python benchmarks/zoo.py fill DIR                              # weights put back here
    python benchmarks/zoo.py run DIR [--device NVIDIA] [--batch 1] [--only NAME,..]
    python benchmarks/zoo.py run DIR --device Portable --peer onnxruntime [--rounds 5]  # CPU

`export` writes DIR/NAME-bBATCH.onnx for batches 1 and 32 (the batch is fixed in the file; the
ONNX exporter of this torch writes static shapes) and DIR/NAME-bBATCH.npz with an input and
onnxruntime's outputs.  With `--graph-only` the large float initializers keep their shapes and
lose their data (a model of a few kB, where the machine that exports cannot hand back files of
the models' size); `fill` then gives them seeded random weights (He-scaled, so activations
stay in range) on the machine that runs them and writes the npz's outputs from that machine's
onnxruntime.  `run` loads each model with tilec (cold: a new cache folder; then warm:
the same folder again, in the same process), runs it with the outputs poisoned, compares with
onnxruntime's outputs (max error over the output's largest magnitude), and times tilec (median
of the kernels' OpenCL event times of one call) and torch eager (median CUDA event time of one
forward) when torch sees a GPU.  With `--peer onnxruntime` both sides' wall times of one call
are timed in turn, `--rounds` times, each figure the median over the rounds; each side's
block of calls starts with WARMUP untimed ones.  One row a model
is printed as soon as it is done: a run cut short still says what it measured."""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

VISION = ["resnet18", "resnet50", "mobilenet_v2", "squeezenet1_1", "efficientnet_b0",
          "densenet121", "googlenet", "mnasnet0_5", "regnet_x_400mf", "vgg11", "alexnet",
          "mobilenet_v3_small", "shufflenet_v2_x1_0", "convnext_tiny"]
OTHER = ["mlp_gelu_ln", "transformer_encoder", "vit_small", "lstm", "gpt_decoder"]


def _modules():
    """name -> (module, input tensor) for batch b; built with torch (export only)."""
    import torch
    import torchvision
    from torch import nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.n, self.b = nn.Linear(256, 1024), nn.LayerNorm(1024), nn.Linear(1024, 256)

        def forward(self, x):
            return self.b(nn.functional.gelu(self.n(self.a(x))))

    class Decoder(nn.Module):
        """GPT-style: token and position embeddings, causal self-attention blocks, LM head."""

        def __init__(self, vocab=1000, d=256, heads=4, layers=2, t=64):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(t, d)
            layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                               norm_first=True, activation="gelu")
            self.blocks = nn.TransformerEncoder(layer, layers)
            self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
            self.register_buffer("mask", torch.triu(torch.full((t, t), float("-inf")), 1))
            self.register_buffer("positions", torch.arange(t))

        def forward(self, ids):
            x = self.tok(ids) + self.pos(self.positions)
            return self.head(self.norm(self.blocks(x, mask=self.mask)))

    class LSTMNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.out = nn.LSTM(64, 128, batch_first=True), nn.Linear(128, 10)

        def forward(self, x):
            y, _ = self.lstm(x)
            return self.out(y[:, -1])

    def vision(name):
        return lambda b: (getattr(torchvision.models, name)(weights=None),
                          torch.randn(b, 3, 224, 224))

    out = {n: vision(n) for n in VISION}
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0,
                                                           batch_first=True), 2)
    out.update({
        "mlp_gelu_ln": lambda b: (MLP(), torch.randn(b, 256)),
        "transformer_encoder": lambda b: (enc, torch.randn(b, 64, 256)),
        "vit_small": lambda b: (torchvision.models.VisionTransformer(
            224, 16, 6, 6, 384, 1536), torch.randn(b, 3, 224, 224)),
        "lstm": lambda b: (LSTMNet(), torch.randn(b, 32, 64)),
        "gpt_decoder": lambda b: (Decoder(), torch.randint(0, 1000, (b, 64))),
    })
    return out


def export(folder: Path, names: list[str], batches: list[int],
           graph_only: bool = False) -> None:
    import onnxruntime as ort
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    # The fused transformer-layer kernel of eval mode has no ONNX export: the plain layers.
    torch.backends.mha.set_fastpath_enabled(False)
    builders = _modules()
    for name in names:
        for b in batches:
            torch.manual_seed(0)
            model, x = builders[name](b)
            model.eval()
            with torch.no_grad():  # parameters left at zero (a ViT's head) would hide errors
                for p in model.parameters():
                    if not p.any():
                        torch.nn.init.normal_(p, std=0.02)
            path = folder / f"{name}-b{b}.onnx"
            with torch.no_grad():
                torch.onnx.export(model, (x,), str(path), opset_version=17, dynamo=False,
                                  input_names=["input"])
            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            feed = {sess.get_inputs()[0].name: x.numpy()}
            np.savez(folder / f"{name}-b{b}.npz", input=x.numpy(),
                     **{f"out{k}": o for k, o in enumerate(sess.run(None, feed))})
            if graph_only:
                _strip(path)
            print(f"exported {path.name}", flush=True)


# Initializers above this many elements lose their data in a graph-only export.
STRIPPED_ABOVE = 256
STRIPPED = "tilec-zoo: weights left out"


def _strip(path: Path) -> None:
    import onnx

    model = onnx.load(str(path))
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) > STRIPPED_ABOVE:
            t.ClearField("raw_data")
            t.ClearField("float_data")
            t.doc_string = STRIPPED
    onnx.save(model, str(path))


def fill(folder: Path, names: list[str] | None) -> None:
    """Seeded random weights into a graph-only export's initializers; the npz's outputs anew."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    for path in sorted(folder.glob("*.onnx")):
        if names and path.stem.rsplit("-b", 1)[0] not in names:
            continue
        model = onnx.load(str(path))
        rng = np.random.default_rng(0)
        todo = [t for t in model.graph.initializer if t.doc_string == STRIPPED]
        for t in todo:
            dims = tuple(t.dims)
            # Biases and scales small; filters scaled by their fan-in (He) so that a deep
            # network's activations neither vanish nor overflow.
            scale = 0.1 if len(dims) == 1 else float(np.sqrt(2.0 / max(int(np.prod(dims[1:])), 1)))
            t.CopyFrom(numpy_helper.from_array(
                (rng.standard_normal(dims) * scale).astype(np.float32), t.name))
        if not todo:
            continue
        onnx.save(model, str(path))
        data = np.load(path.with_suffix(".npz"))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outs = sess.run(None, {sess.get_inputs()[0].name: data["input"]})
        np.savez(path.with_suffix(".npz"), input=data["input"],
                 **{f"out{k}": o for k, o in enumerate(outs)})
        print(f"filled {path.name} ({len(todo)} initializers)", flush=True)


def _torch_time(name: str, batch: int, x: np.ndarray, repeat: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from gpu import torch_timer

    torch.backends.mha.set_fastpath_enabled(True)  # torch at its fastest
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model, _ = _modules()[name](batch)
    model = model.eval().cuda()  # the same architecture: only its time is compared
    tx = torch.from_numpy(x).cuda()
    with torch.no_grad():
        t, _ = torch_timer(lambda: model(tx), repeat, 20.0)
    return t


def _kernel_count(exe) -> str:
    """Kernels per call, and those run once at load (they read the weights alone)."""
    once = len(getattr(exe.last, "hoisted", ()))
    per_call = len(exe.kernels) - once
    return f"{per_call} (+{once} at load)" if once else str(per_call)


def _profile(exe, top: int) -> None:
    """The `top` slowest kernels of the last call: where a model's time goes."""
    launch = exe.last
    total = sum(launch.last_timings.values())
    rows = sorted([k for k in launch.kernels if k.name in launch.last_timings],
                  key=lambda k: -launch.last_timings[k.name])
    for k in rows[:top]:
        t = launch.last_timings.get(k.name, 0.0)
        rate = f"{k.flops / t * 1e-9:.0f} GFLOP/s" if t and k.flops else "-"
        print(f"#   {k.name} ({k.kind}): {t * 1e3:.3f} ms ({t / total:.0%}), {rate}, "
              f"global {k.global_size} local {k.local_size}, tile {k.tile}", flush=True)


def _ort_session(path: Path, feed: dict):
    """onnxruntime's CPU provider, its default threads (every core, as PoCL uses): a call
    taking no arguments, made once here (its first call builds what it caches)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    sess.run(None, feed)
    return lambda: sess.run(None, feed)


def _median_wall(call, repeat: int) -> float:
    for _ in range(WARMUP):
        call()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# Seconds between one side's calls and the other's: onnxruntime's workers spin on after a
# call (as in `benchmarks/run.py --rounds`).
PAUSE_S = 0.2
# Untimed calls at the start of each side's block of calls.  After the pause, or after the
# other side's block, a tilec call on PoCL's threads ran slow for its first calls (squeezenet1_1
# on the 2-core Zen 4: 7.3-10 ms for six calls, then 4.6-5.6), which the median of a block of
# 10 then measured; onnxruntime's spinning workers hide the same wake-up.  Both sides get it.
WARMUP = 6


def _alternated(exe, feed: dict, peer, repeat: int, rounds: int) -> tuple[float, float, float]:
    """tilec (kernels' summed event time, wall) and the peer (wall), timed in turn `rounds`
    times, `repeat` calls a side a round after WARMUP untimed ones: each figure the median
    over the rounds of the rounds' medians, so that the machine's slow and fast phases fall
    on both sides."""
    ks, ws, ps = [], [], []
    for _ in range(max(1, rounds)):
        kern, wall = [], []
        for _ in range(WARMUP):
            exe.run(feed)
        for _ in range(repeat):
            t0 = time.perf_counter()
            exe.run(feed)
            wall.append(time.perf_counter() - t0)
            kern.append(sum(exe.last.last_timings.values()))
        ks.append(statistics.median(kern))
        ws.append(statistics.median(wall))
        time.sleep(PAUSE_S)
        ps.append(_median_wall(peer, repeat))
        time.sleep(PAUSE_S)
    return statistics.median(ks), statistics.median(ws), statistics.median(ps)


def run(folder: Path, names: list[str], batch: int, device: str | None, repeat: int,
        profile: int = 0, peer_name: str = "torch", chains: bool = True,
        split_k: bool | int | None = None, rounds: int = 1, host_io: bool = True) -> None:
    from host import cpu_model

    import tilec.onnx
    from tilec.config import Config

    print(f"# {datetime.date.today()}; command: python benchmarks/zoo.py "
          f"{' '.join(sys.argv[1:])}")
    print(f"# host CPU: {cpu_model()}")
    if peer_name == "torch":
        print(f"| model (batch {batch}) | kernels | load cold | load warm | tilec | torch eager "
              f"fp32 | tilec / torch (speed) | max error / max |outputs| |")
        print("|---|---|---|---|---|---|---|---|")
    else:  # wall times of one call on both sides
        print(f"| model (batch {batch}) | kernels | load cold | load warm | tilec (kernels) | "
              f"tilec (wall) | onnxruntime CPU (wall) | tilec / onnxruntime (speed, wall) | "
              f"max error / max |outputs| |")
        print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        path = folder / f"{name}-b{batch}.onnx"
        if not path.exists():
            continue
        try:
            data = np.load(folder / f"{name}-b{batch}.npz")
            cache = tempfile.mkdtemp(prefix="tilec-zoo-")
            config = Config(device=device, cache_dir=Path(cache), chains=chains,
                            split_k=split_k, host_io=host_io)
            t0 = time.perf_counter()
            exe = tilec.onnx.load(str(path), config=config)
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            exe = tilec.onnx.load(str(path), config=config)
            warm = time.perf_counter() - t0
            feed = {exe.inputs[0]: data["input"]}
            got = exe.run(feed, poison=True)
            want = [data[k] for k in sorted(data.files) if k.startswith("out")]
            errs = [float(np.abs(g.astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-30))
                    for g, w in zip(got.values(), want, strict=False)]
            if peer_name == "onnxruntime":
                ours, wall, peer = _alternated(
                    exe, feed, _ort_session(path, {exe.inputs[0]: data["input"]}), repeat,
                    rounds)
                print(f"| {name} | {_kernel_count(exe)} | {cold:.1f} s | {warm:.2f} s | "
                      f"{ours * 1e3:.3f} ms | {wall * 1e3:.3f} ms | {peer * 1e3:.3f} ms | "
                      f"{peer / wall:.2f} | {max(errs):.1e} |", flush=True)
                if profile:
                    _profile(exe, profile)
                continue
            times = []
            for _ in range(repeat):
                exe.run(feed)
                times.append(sum(exe.last.last_timings.values()))
            ours = statistics.median(times)
            peer = _torch_time(name, batch, data["input"], repeat)
            ratio = f"{peer / ours:.2f}" if peer else "-"
            peer_text = f"{peer * 1e3:.3f} ms" if peer else "-"
            print(f"| {name} | {_kernel_count(exe)} | {cold:.1f} s | {warm:.2f} s | "
                  f"{ours * 1e3:.3f} ms | {peer_text} | {ratio} | {max(errs):.1e} |", flush=True)
            if profile:
                _profile(exe, profile)
        except Exception as e:  # one model's failure is a row, not the end of the table
            first = str(e).splitlines()[0][:150] if str(e) else type(e).__name__
            print(f"| {name} | failed: {first} | | | | | | |", flush=True)
            traceback.print_exc(file=sys.stderr)



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["export", "fill", "run"])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--only", help="comma-separated model names")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--batches", default="1,32", help="export: the batches to write")
    ap.add_argument("--graph-only", action="store_true",
                    help="export: leave the large weights' data out (`fill` puts random ones back)")
    ap.add_argument("--device")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run with --peer onnxruntime: time tilec and onnxruntime in turn "
                         "this many times (--repeat calls a side a round); each figure is the "
                         "median over the rounds")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="run: after each model's row, its N slowest kernels")
    ap.add_argument("--peer", choices=["torch", "onnxruntime"], default="torch",
                    help="run: torch eager on the GPU (kernel times), or onnxruntime's CPU "
                         "provider (wall times of one call on both sides)")
    ap.add_argument("--no-chains", action="store_true",
                    help="run: one launch a kernel (no chains of small kernels, `plan.chain`)")
    ap.add_argument("--copies", action="store_true",
                    help="run: inputs and outputs copied into and out of the executable's "
                         "buffers (Config.host_io=False)")
    ap.add_argument("--split-k", default="auto", metavar="auto|off|N",
                    help="run: sums split in parts (`plan.splitk`): where predicted faster, "
                         "never, or in N parts")
    args = ap.parse_args()
    split_k = {"auto": None, "off": False}.get(args.split_k) if not args.split_k.isdigit() \
        else int(args.split_k)
    names = args.only.split(",") if args.only else VISION + OTHER
    if args.what == "export":
        export(args.folder, names, [int(b) for b in args.batches.split(",")], args.graph_only)
    elif args.what == "fill":
        fill(args.folder, args.only.split(",") if args.only else None)
    else:
        run(args.folder, names, args.batch, args.device, args.repeat, args.profile, args.peer,
            chains=not args.no_chains, split_k=split_k, rounds=args.rounds,
            host_io=not args.copies)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
