"""Near-duplicate detection quality of fingerprint recipes, measured.

Corpus: the Python standard library's files (>= 500 characters) and CJK
documents composed here from a small vocabulary (>= 1,000 characters).
Positives: each sampled document against variants with 1, 2, 5, 10 and 20% of
its words edited (deletions, insertions, substitutions, swaps; seeded; CJK
text is edited by character). Negatives: pairs of distinct documents whose
word 4-shingle Jaccard similarity is below 0.3.

For each method and k in 0..6: recall per edit rate, false-positive rate,
precision at a 1:100 mix of positives to negatives; speed in MB/s on one core.

Usage: python tools/eval_quality.py [--quick] [--docs N] [--negatives N] [--json out.json]
"""

import argparse
import json
import pathlib
import random
import re
import sysconfig
import time

import simhashdb

RATES = (0.01, 0.02, 0.05, 0.10, 0.20)
KS = range(7)
HAN = ("网页 搜索 引擎 爬虫 系统 重复 内容 数据 文档 指纹 算法 海量 索引 查询 存储 服务器 用户 信息 "
       "时间 问题 方法 结果 速度 质量 相似 距离 分布 随机 计算 资源 网络 站点 更新 版本 模型 向量 "
       "特征 权重 哈希 编码 长度 文本 中文 日本 语言 分词 词语 句子 段落 标题 作者 读者 今天 明天 "
       "我们 他们 大家 学校 老师 学生 城市 公园 天气 早上 晚上 工作 生活 朋友 家人 电影 音乐 书籍 "
       "历史 科学 技术 经济 社会 文化 自然 环境 健康 运动 旅行 食物 咖啡 茶叶 山水 河流 森林 道路")
KANA = ("これは テスト です。 私たちは 毎日 新しい 文書を 読みます。 ウェブ ページの 重複を "
        "見つける ことは 大切です。 検索 エンジンは 多くの ページを 集めます。 東京 京都 大阪 "
        "春 夏 秋 冬 天気 仕事 学校 友達 音楽 映画 料理 旅行 時間 問題 方法 結果")
GLUE = "的 了 在 是 和 也 都 就 而 但 所以 因为 如果 虽然 然后 已经 正在 可以 需要 应该 非常".split()
PUNCT = "，。；！？、"


def stdlib_documents(limit, rng):
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    texts = []
    for path in rng.sample(paths, len(paths)):
        text = path.read_text("utf-8", "replace")
        if len(text) >= 500:
            texts.append(text)
        if len(texts) == limit:
            break
    return texts


def cjk_documents(count, rng):
    """Composed documents: random sentences of a small Chinese and Japanese vocabulary."""
    words, kana = HAN.split(), KANA.split()
    docs = []
    for i in range(count):
        topic = rng.sample(words, 25)  # each document leans on its own words, as real ones do
        sentences = []
        while sum(map(len, sentences)) < 1000 + rng.randrange(1500):
            if i % 4 == 3:
                sentences.append("".join(rng.choice(kana) for _ in range(rng.randint(4, 9))))
            else:
                parts = [rng.choice(topic if rng.random() < 0.7 else words) + rng.choice(GLUE)
                         for _ in range(rng.randint(3, 8))]
                sentences.append("".join(parts) + rng.choice(PUNCT))
        docs.append("".join(sentences))
    return docs


def is_cjk(text):
    return sum(1 for c in text[:200] if ord(c) > 0x3000) > 50


def edit(text, rate, rng):
    """``text`` with ``rate`` of its words (characters for CJK) deleted, inserted,
    substituted or swapped; whitespace between words is kept."""
    if is_cjk(text):
        units, seps = list(text), None
    else:
        parts = re.split(r"(\s+)", text)
        units, seps = parts[0::2], parts[1::2]
    vocabulary = [u for u in units if u]
    for _ in range(max(1, round(rate * len(units)))):
        i = rng.randrange(len(units))
        op = rng.randrange(4)
        if op == 0:
            units[i] = ""
        elif op == 1:
            units[i] = units[i] + ("" if seps is None else " ") + rng.choice(vocabulary)
        elif op == 2:
            units[i] = rng.choice(vocabulary)
        elif i + 1 < len(units):
            units[i], units[i + 1] = units[i + 1], units[i]
    if seps is None:
        return "".join(units)
    return "".join(u + (seps[j] if j < len(seps) else "") for j, u in enumerate(units))


def shingle_set(text, n=4):
    words = text.split()
    return {hash(tuple(words[i:i + n])) for i in range(max(1, len(words) - n + 1))}


def negatives(docs, count, rng):
    sets = [shingle_set(d) for d in docs]
    pairs, tries = [], 0
    while len(pairs) < count and tries < 20 * count:
        tries += 1
        a, b = rng.sample(range(len(docs)), 2)
        union = len(sets[a] | sets[b])
        if union and len(sets[a] & sets[b]) / union < 0.3:
            pairs.append((a, b))
    return pairs


def methods(peers_too=True):
    """name -> text-to-fingerprint function, ours first, then the peers found."""
    out = {"simhashdb default (chars, n=3, CJK n=2)": simhashdb.fingerprint,
           "simhashdb chars n=3 (CJK too)": lambda t: simhashdb.fingerprint(t, cjk_window=None)}
    for n in (1, 2, 3, 4):
        out["simhashdb words n=%d" % n] = (
            lambda t, n=n: simhashdb.fingerprint(t, window=n, unit="words", cjk_window=None))
    for n in (1, 2, 4):
        out["simhashdb chars n=%d" % n] = (
            lambda t, n=n: simhashdb.fingerprint(t, window=n, unit="chars", cjk_window=None))
    if not peers_too:
        return out
    try:
        import peers
        e0ng = peers.load("simhash_1e0ng")
        if e0ng:
            out["PyPI simhash (1e0ng) defaults"] = lambda t: e0ng.Simhash(t).value
        pybind = peers.load("simhash_pybind")
        if pybind:
            out["seed-000 recipe (md5 word 4-shingles)"] = lambda t: pybind.compute(
                [pybind.unsigned_hash(" ".join(s).encode()) for s in pybind.shingle(t.split(), 4)])
    except ImportError:
        pass
    try:
        from samecode.halohash import BitAverageHaloHash
        out["samecode halo 64 (words)"] = lambda t: int(
            BitAverageHaloHash(t.encode().split(), size_in_bits=64).hexdigest(), 16)
    except ImportError:
        pass
    return out


def evaluate(name, method, docs, variants, pairs):
    start = time.perf_counter()
    fps = [method(d) for d in docs]
    seconds = time.perf_counter() - start
    megabytes = sum(len(d.encode()) for d in docs) / 1e6
    row = {"method": name, "mb_per_s": megabytes / seconds, "recall": {}, "recall_cjk": {},
           "fpr": {}}
    cjk = [is_cjk(d) for d in docs]
    for rate, texts in variants.items():
        dists = [(bin(fps[i] ^ method(t)).count("1"), cjk[i]) for i, t in texts]
        row["recall"][rate] = {k: sum(d <= k for d, _ in dists) / len(dists) for k in KS}
        cjk_dists = [d for d, is_c in dists if is_c]
        row["recall_cjk"][rate] = {k: sum(d <= k for d in cjk_dists) / max(1, len(cjk_dists))
                                   for k in KS}
    neg = [bin(fps[a] ^ fps[b]).count("1") for a, b in pairs]
    row["fpr"] = {k: sum(d <= k for d in neg) / len(neg) for k in KS}
    recall5 = row["recall"][0.05]
    row["precision_1_100"] = {k: recall5[k] / (recall5[k] + 100 * row["fpr"][k])
                              if recall5[k] else 0.0 for k in KS}
    return row


def markdown(rows, k):
    lines = ["| method (k = %d) | %s | CJK recall 5%% | FPR | precision 1:100 (5%%) | MB/s |"
             % (k, " | ".join("recall %g%%" % (100 * r) for r in RATES)),
             "|---|" + "---:|" * (len(RATES) + 4)]
    for row in rows:
        lines.append("| %s | %s | %.3f | %.1e | %.3f | %.1f |" % (
            row["method"], " | ".join("%.3f" % row["recall"][r][k] for r in RATES),
            row["recall_cjk"][0.05][k], row["fpr"][k], row["precision_1_100"][k],
            row["mb_per_s"]))
    return "\n".join(lines)


QUICK = {"doc_count": 150, "cjk_count": 40, "negative_count": 5000}


def run(doc_count, cjk_count, negative_count, seed=0, only=None):
    """Evaluate every method (or those named in ``only``); returns the rows."""
    rng = random.Random(seed)
    docs = stdlib_documents(doc_count, rng) + cjk_documents(cjk_count, rng)
    variants = {rate: [(i, edit(d, rate, rng)) for i, d in enumerate(docs)] for rate in RATES}
    pairs = negatives(docs, negative_count, rng)
    ours_only = only is not None and all(name.startswith("simhashdb") for name in only)
    return [evaluate(name, fn, docs, variants, pairs)
            for name, fn in methods(peers_too=not ours_only).items()
            if only is None or name in only]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small sample (seconds)")
    parser.add_argument("--only", action="append", help="evaluate only this method (repeatable)")
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--cjk", type=int, default=200)
    parser.add_argument("--negatives", type=int, default=100_000)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.quick:
        args.docs, args.cjk, args.negatives = QUICK.values()
    rows = run(args.docs, args.cjk, args.negatives, only=args.only)
    for k in (2, 3, 4):
        print(markdown(rows, k) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
