import collections
import math
import pathlib
import sys
import sysconfig
import unicodedata
from array import array

import numpy as np
import pytest
import simhash as simhash_py  # simhash-pybind: simhash-py's C++ core
from hypothesis import given
from hypothesis import strategies as st

import simhashdb
from simhashdb import _text
from simhashdb import InvalidArgumentError, InvalidFingerprintError, SimhashDBError
from simhashdb.fingerprint import _word_weights

MAX = 2**64 - 1
fingerprints = st.one_of(st.integers(0, MAX), st.sampled_from([0, 1, MAX, MAX - 1, 2**63]))


def reference_compute(hashes):
    ones = [sum((h >> j) & 1 for h in hashes) for j in range(64)]
    return sum(1 << j for j in range(64) if 2 * ones[j] > len(hashes))


def reference_weighted(pairs):
    sums = [sum(w if (h >> j) & 1 else -w for h, w in pairs) for j in range(64)]
    return sum(1 << j for j in range(64) if sums[j] > 0)


@given(st.lists(fingerprints, max_size=50))
def test_compute_matches_reference_and_simhash_py(hashes):
    expected = reference_compute(hashes)
    assert simhashdb.compute(hashes) == expected
    assert simhash_py.compute(hashes) == expected
    assert simhashdb.compute(array("Q", hashes)) == expected
    assert simhashdb.compute(np.array(hashes, dtype=np.uint64)) == expected
    assert simhashdb.compute(iter(hashes)) == expected


def test_compute_ties_and_edges():
    assert simhashdb.compute([]) == 0
    assert simhashdb.compute([1, 0]) == 0  # a tie gives 0
    assert simhashdb.compute([1, 1, 0]) == 1
    assert simhashdb.compute([MAX]) == MAX
    assert simhashdb.compute([MAX, 0, MAX]) == MAX


@given(st.lists(st.tuples(fingerprints, st.integers(-1000, 1000)), max_size=30))
def test_compute_weighted_matches_reference(pairs):
    assert simhashdb.compute_weighted(pairs) == reference_weighted(pairs)


def test_compute_weighted_unit_weights_equal_compute():
    hashes = [3, 5, 6, MAX, 0]
    assert simhashdb.compute_weighted((h, 1) for h in hashes) == simhashdb.compute(hashes)
    assert simhashdb.compute_weighted([(0b1011, 2.5)]) == 0b1011
    assert simhashdb.compute_weighted([(0b1011, -1)]) == MAX ^ 0b1011


@given(fingerprints, fingerprints)
def test_num_differing_bits(a, b):
    expected = bin(a ^ b).count("1")
    assert simhashdb.num_differing_bits(a, b) == expected
    assert simhash_py.num_differing_bits(a, b) == expected


@given(st.lists(st.tuples(fingerprints, fingerprints), max_size=40))
def test_num_differing_bits_many(pairs):
    a = [x for x, _ in pairs]
    b = [y for _, y in pairs]
    assert list(simhashdb.num_differing_bits_many(a, b)) == [bin(x ^ y).count("1") for x, y in pairs]
    if pairs:
        probe = b[0]
        got = simhashdb.num_differing_bits_many(np.array(a, dtype=np.uint64), probe)
        assert list(got) == [bin(x ^ probe).count("1") for x in a]


def test_seed_examples_of_hamming_distance():
    # seed 004: A = 100111, B = 101010 differ in 3 bits
    assert simhashdb.num_differing_bits(0b100111, 0b101010) == 3
    # seed 000/001: a corpus fingerprint and a query three bits away (blocks B, D, E)
    corpus = int("0100101110111011001000101111101110111100001010011101100110110101", 2)
    query = int("0100101110111011011000101111101110011100001010011100100110110101", 2)
    diff = int("0000000000000000010000000000000000100000000000000001000000000000", 2)
    assert corpus ^ query == diff
    assert simhashdb.num_differing_bits(corpus, query) == 3


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, "12", None, b"\x01"])
def test_bad_fingerprints_raise_clear_errors(bad):
    with pytest.raises(InvalidFingerprintError) as info:
        simhashdb.num_differing_bits(bad, 0)
    assert "[0, 2**64)" in str(info.value)
    with pytest.raises(InvalidFingerprintError):
        simhashdb.compute([1, bad])
    assert issubclass(InvalidFingerprintError, (SimhashDBError, ValueError, TypeError))


def test_bad_buffers_raise_clear_errors():
    with pytest.raises(InvalidFingerprintError, match="format 'q'"):
        simhashdb.compute(array("q", [1, 2]))
    with pytest.raises(InvalidFingerprintError, match="unsigned 64-bit"):
        simhashdb.compute(b"abcdefgh")
    with pytest.raises(InvalidArgumentError, match="equal length"):
        simhashdb.num_differing_bits_many([1, 2], [1])
    with pytest.raises(InvalidArgumentError, match="pair"):
        simhashdb.compute_weighted([5])
    with pytest.raises(InvalidArgumentError, match="finite"):
        simhashdb.compute_weighted([(5, float("nan"))])


@given(st.binary(max_size=64))
def test_unsigned_hash_matches_simhash_py(data):
    assert simhashdb.unsigned_hash(data) == simhash_py.unsigned_hash(data)


@given(st.lists(st.text(max_size=3), max_size=12), st.integers(1, 6))
def test_shingle_matches_simhash_py(tokens, window):
    assert list(simhashdb.shingle(tokens, window)) == list(simhash_py.shingle(tokens, window))


def test_shingle_is_a_generator_that_stops_cleanly():
    assert list(simhashdb.shingle("abcdef", 4)) == [list("abcd"), list("bcde"), list("cdef")]
    assert list(simhashdb.shingle(iter("ab"), 4)) == []
    for bad in (0, -2, 1.5):
        with pytest.raises(InvalidArgumentError, match="window"):
            list(simhashdb.shingle("abc", bad))


def test_fingerprint_with_md5_reproduces_the_seed_000_recipe():
    text = "the cat sat on the mat and then the dog sat on the cat"
    tokens = text.split()
    expected = simhash_py.compute(
        [simhash_py.unsigned_hash(" ".join(s).encode()) for s in simhash_py.shingle(tokens, 4)])
    assert simhashdb.fingerprint(text, unit="words", window=4,
                                 hasher=simhashdb.unsigned_hash) == expected


@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_fingerprint_is_deterministic_and_str_equals_utf8_bytes(text):
    fp = simhashdb.fingerprint(text)
    assert 0 <= fp <= MAX
    assert simhashdb.fingerprint(text) == fp
    assert simhashdb.fingerprint(text.encode("utf-8")) == fp


def test_fingerprint_normalises_case_width_and_space():
    assert simhashdb.fingerprint("Hello,  World!\n") == simhashdb.fingerprint("hello, world!")
    assert simhashdb.fingerprint("ＨＥＬＬＯ world") == simhashdb.fingerprint("hello world")
    assert simhashdb.fingerprint("Hello, World!", unit="words") == \
        simhashdb.fingerprint("hello world", unit="words")
    assert simhashdb.fingerprint("") == 0 and simhashdb.fingerprint(" \t\n") == 0
    assert simhashdb.fingerprint("...", unit="words") == 0


def test_normalize():
    assert simhashdb.normalize("Straße ＡＢＣ ﬁ") == "strasse abc fi"
    assert simhashdb.normalize(b"caf\xc3\xa9 \xff") == "café \ufffd"


def test_tokenize_splits_cjk_into_characters_and_keeps_words():
    assert simhashdb.tokenize("你好world 123 カタカナ 한국") == [
        "你", "好", "world", "123", "カ", "タ", "カ", "ナ", "한", "국"]
    assert simhashdb.tokenize("naïve—café, x_y «ok» 3.14 🙂 ok") == [
        "naïve", "café", "x", "y", "ok", "3", "14", "ok"]
    assert simhashdb.tokenize("a b,c", unit="chars") == ["a", "b", ",", "c"]
    for not_text in (b"abc", None, 5):
        with pytest.raises(simhashdb.InvalidArgumentError, match="expects normalised text"):
            simhashdb.tokenize(not_text)


@given(st.text(max_size=80))
def test_native_tokens_match_a_python_reading_of_the_rules(text):
    chars = [c for c in text if not c.isspace() or c in "\x1c\x1d\x1e\x1f"]
    assert simhashdb.tokenize(text, unit="chars") == chars


def test_html_is_stripped_of_markup_scripts_and_styles():
    page = ("<html><head><style>p {color: red}</style><script>var x = 1;</script>"
            "<title>Title</title></head><body><p>Fish &amp; chips</p><!-- note -->"
            "<div>more<br>text</div></body></html>")
    assert simhashdb.html_to_text(page).split() == ["Title", "Fish", "&", "chips", "more", "text"]
    assert simhashdb.fingerprint(page, html=True) == \
        simhashdb.fingerprint("Title Fish & chips more text")
    assert simhashdb.fingerprint(page.encode(), html=True) == simhashdb.fingerprint(page, html=True)


def test_fingerprint_many_and_the_native_path_agree_with_explicit_tokens():
    texts = ["one two three four", "我们毎日新しい文書", ""]
    assert simhashdb.fingerprint_many(texts) == [simhashdb.fingerprint(t) for t in texts]
    for t in texts:
        norm = simhashdb.normalize(t)
        assert simhashdb.fingerprint(t, idf=None) == simhashdb.fingerprint(
            t, tokenizer=lambda x: simhashdb.tokenize(x, unit="chars"))
        assert simhashdb.fingerprint(t, unit="words", window=2) == simhashdb.fingerprint(
            t, window=2, tokenizer=simhashdb.tokenize)
        assert norm == simhashdb.normalize(norm)


def _words(n, seed, vocabulary):
    """``n`` words of 10 variants of each of ``vocabulary``: text repeats its words."""
    import random
    rng = random.Random(seed)
    return [rng.choice(vocabulary) + str(rng.randrange(10)) for _ in range(n)]


def test_fingerprint_keeps_near_duplicates_closer_than_unrelated_text():
    doc = _words(400, 1, ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"])
    edited = list(doc)
    edited[100] = "changed"
    other = _words(400, 2, ["red", "green", "blue", "cyan", "magenta", "yellow", "black"])
    same = simhashdb.num_differing_bits(simhashdb.fingerprint(" ".join(doc)),
                                        simhashdb.fingerprint(" ".join(edited)))
    far = simhashdb.num_differing_bits(simhashdb.fingerprint(" ".join(doc)),
                                       simhashdb.fingerprint(" ".join(other)))
    assert same <= 3 < 16 <= far


def test_fingerprint_of_chinese_text_is_meaningful():
    base = "近重复网页检测是搜索引擎爬虫系统中的重要问题，镜像网站和内容复制都会造成资源浪费。" * 3
    edited = base.replace("资源", "存储", 1)
    unrelated = "今天天气很好，我们一起去公园散步，然后吃了一顿非常美味的午饭，大家都很开心。" * 3
    fp = simhashdb.fingerprint(base)
    assert simhashdb.num_differing_bits(fp, simhashdb.fingerprint(edited)) <= 6
    assert simhashdb.num_differing_bits(fp, simhashdb.fingerprint(unrelated)) >= 16


def test_fingerprint_steps_are_replaceable():
    text = "one two three four five"
    constant = simhashdb.fingerprint(text, tokenizer=lambda t: ["x", "y"])
    assert constant == simhashdb.fingerprint("other words", tokenizer=lambda t: ["x", "y"])
    assert constant != simhashdb.fingerprint(text)
    custom = simhashdb.fingerprint(text, window=2, unit="words", hasher=lambda b: len(b))
    assert custom == simhashdb.compute(len(" ".join(p).encode()) for p in
                                       simhashdb.shingle(text.split(), 2))


def test_fingerprint_rejects_bad_input():
    with pytest.raises(InvalidArgumentError, match="unit"):
        simhashdb.fingerprint("abc", unit="lines")
    with pytest.raises(InvalidArgumentError, match="str or bytes"):
        simhashdb.fingerprint(12)
    with pytest.raises(InvalidArgumentError, match="window"):
        simhashdb.fingerprint("abc", window=0)
    with pytest.raises(InvalidArgumentError, match="bytes"):
        simhashdb.unsigned_hash("text")


def test_cjk_characters_start_shorter_shingles():
    latin = "the quick brown fox jumps over the lazy dog"
    chinese = "近重复网页检测是搜索引擎爬虫系统中的重要问题"
    assert simhashdb.fingerprint(latin, idf=None) == simhashdb.fingerprint(latin, cjk_window=None)
    assert simhashdb.fingerprint(chinese, idf=None) != \
        simhashdb.fingerprint(chinese, cjk_window=None)
    assert simhashdb.fingerprint(chinese, cjk_window=(4, 3, 2)) == \
        simhashdb.fingerprint(chinese, cjk_window=None)
    # the shingles of a CJK run are its characters and character pairs
    assert simhashdb.fingerprint(chinese, idf=None) == simhashdb.fingerprint(chinese, window=[2, 1])
    for bad in (0, 33, (), (2, 0), "2", 2.0):
        with pytest.raises(InvalidArgumentError, match="window"):
            simhashdb.fingerprint(chinese, cjk_window=bad)
        with pytest.raises(InvalidArgumentError, match="window"):
            simhashdb.fingerprint(chinese, window=bad)


def _fmix64(h):
    for multiplier in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        h = ((h ^ (h >> 33)) * multiplier) & MAX
    return h ^ (h >> 33)


def reference_shingle_fingerprint(tokens, lengths, cjk_lengths, max_run=None):
    """The default path's shingling, written plainly: runs capped at
    ``max_run``, then from each token one shingle per length that fits,
    hashed by folding the tokens' fast hashes."""
    if max_run:
        tokens = [t for i, t in enumerate(tokens)
                  if i < max_run or any(u != t for u in tokens[i - max_run:i])]
    def shingle_hash(part):
        h = 0
        for token in part:
            h = ((((h << 23) | (h >> 41)) & MAX) ^ simhashdb.fast_hash(token.encode())) \
                * 0x9E3779B97F4A7C15 & MAX
        return _fmix64(h)

    def is_cjk(token):
        return simhashdb.tokenize(token, "words") == [token] and len(token) == 1 and \
            simhashdb.tokenize(token + token, "words") == [token, token]

    features = [shingle_hash(tokens[i:i + n]) for i in range(len(tokens))
                for n in (cjk_lengths if is_cjk(tokens[i]) else lengths) if i + n <= len(tokens)]
    if not features and tokens:
        features = [shingle_hash(tokens)]
    return reference_compute(features) if features else 0


@given(st.lists(st.sampled_from(["a", "b", "ab", "网", "页", "é", "x1"]), max_size=12),
       st.sets(st.integers(1, 5), min_size=1), st.sets(st.integers(1, 5), min_size=1),
       st.sampled_from([None, 1, 2, 3]))
def test_shingles_of_several_lengths_match_a_plain_reference(tokens, lengths, cjk_lengths,
                                                            max_run):
    got = simhashdb.fingerprint(" ".join(tokens), window=lengths, cjk_window=cjk_lengths,
                                max_run=max_run, tokenizer=lambda text: text.split())
    assert got == reference_shingle_fingerprint(tokens, sorted(lengths), sorted(cjk_lengths),
                                                max_run)


def test_the_native_tokenizer_feeds_the_same_shingles():
    for text in ("Near-duplicate pages, 近重复网页 and 重複ページ.", "ab", "a", ""):
        tokens = simhashdb.tokenize(simhashdb.normalize(text), "chars")
        assert simhashdb.fingerprint(text, idf=None) == reference_shingle_fingerprint(
            tokens, (2, 3, 4), (1, 2), 3)


@given(st.text(alphabet=st.sampled_from("ab \t\n\x0b\x00\x7fé网ページ\u3000\u00a0\u2028,."),
               max_size=40))
def test_the_ascii_table_path_agrees_with_the_general_tokenizer(text):
    def general(t):
        return simhashdb.tokenize(t, "chars")
    for options in ({"idf": None}, {"window": 3, "cjk_window": 2}, {"window": 1}):
        assert simhashdb.fingerprint(text, **options) == \
            simhashdb.fingerprint(text, tokenizer=general, **options)


def test_runs_of_one_character_weigh_no_more_than_three():
    text = "Results\n" + "=" * 7 + "\n\nThe table below compares the methods."
    def shingled(t):
        return simhashdb.fingerprint(t, idf=None)
    assert shingled(text) == shingled(text.replace("=" * 7, "=" * 3))
    assert shingled(text) != shingled(text.replace("=" * 7, "=" * 2))
    assert simhashdb.fingerprint(text, max_run=None) != \
        simhashdb.fingerprint(text.replace("=" * 7, "=" * 3), max_run=None)
    for bad in (0, -1, 2.5, "3"):
        with pytest.raises(InvalidArgumentError, match="max_run"):
            simhashdb.fingerprint(text, max_run=bad)


# Stored databases hold these exact values: a recipe's output may never change.
# (Recipe 1's were computed by the release that introduced it.)
RECIPE_OUTPUTS = {
    "simhashdb-1/nfkc-casefold/chars/window-3/cjk-window-2/counts/fast-hash": [
        6071567857652246280, 11561576039329793828, 521599230246856460, 0,
        11646731384224751610],
    "simhashdb-2/nfkc-casefold/chars/runs-3/shingles-2-3-4/cjk-shingles-1-2/counts/fast-hash": [
        8145464215248463635, 16174942489462693685, 521599230246856460, 0,
        14021735727837219826],
    "simhashdb-3/nfkc-casefold/words/distinct/sqrt-count-idf-5000/fast-hash": [
        8835996191050409658, 10490479709361430235, 9890164781396648852, 0,
        4459044775966391753],
}
RECIPE_TEXTS = ["The quick brown fox jumps over the lazy dog.", "网页搜索引擎 重複ページ 검색 엔진",
                "a", "", "Title\n=========\n\nBody text, café."]


def test_every_known_recipe_keeps_its_outputs():
    assert set(simhashdb.RECIPES) == set(RECIPE_OUTPUTS)
    for name, expected in RECIPE_OUTPUTS.items():
        got = [simhashdb.fingerprint(t, **simhashdb.RECIPES[name]) for t in RECIPE_TEXTS]
        assert got == expected, name


def reference_weighted_words(text):
    """Recipe 3 written plainly: each distinct word weighs round(sqrt(count)
    * its table weight), columns summed, positive columns are 1 bits."""
    hashes, weights, absent = _word_weights(simhashdb.fingerprint.__globals__["WORD_WEIGHTS"])
    table = dict(zip(hashes, weights))
    sums = [0] * 64
    words = simhashdb.tokenize(simhashdb.normalize(text), "words")
    for word, count in collections.Counter(words).items():
        h = simhashdb.fast_hash(word.encode("utf-8", "surrogatepass"))
        weight = int(math.sqrt(count) * table.get(h, absent) + 0.5)
        for bit in range(64):
            sums[bit] += weight if h >> bit & 1 else -weight
    return sum(1 << bit for bit in range(64) if sums[bit] > 0)


@given(st.lists(st.sampled_from(
    list("ab Z9_-.,\n\té日本語한국어ßΣσ\u0301\u3000\x00") + ["the ", "and ", "return ", "café "]),
    max_size=60).map("".join))
def test_weighted_words_match_a_plain_reference(text):
    assert simhashdb.fingerprint(text) == reference_weighted_words(text)


UNICODE_CASES = list("aZ9 _-.,;\n\t\x00\x1f\x7f\x85\xa0\xadéÉßẞİıΣσςΐﬁﬀǅ\u0301\u0345\u3000"
                     "\u2028日本語한국어ｶﾞＡ①Ⅻ\ud800\udfff\U0001E900\U00010400𝔄") + [
    "the ", "Straße ", "ΣΟΦΟΣ ", "İstanbul ", "<p>", "</p>", "<script>x</script>", "<!--",
    "&amp;", "&#223;", "&szlig; ", "<b>B</b>"]


def old_fingerprint_with_signature(text, html):
    """Recipe 3 as computed before the native case folding: Python's
    str.casefold, then each kernel reading its own UTF-8 copy."""
    plain = simhashdb.strip_html(text) if html else text
    signature = _text.word_minhash(simhashdb.normalize(plain).encode("utf-8", "surrogatepass"))
    return reference_weighted_words(plain), signature


@given(st.one_of(st.text(st.characters(blacklist_categories=())),
                 st.lists(st.sampled_from(UNICODE_CASES), max_size=40).map("".join)),
       st.booleans())
def test_native_case_folding_keeps_every_output(text, html):
    expected = old_fingerprint_with_signature(text, html)
    assert simhashdb.fingerprint_with_signature(text, html=html, signature_bits=16) == expected
    assert simhashdb.fingerprint_with_signature(text, html=html) == (
        expected[0], simhashdb._ext.narrow(expected[1]))
    assert simhashdb.fingerprint(text, html=html) == expected[0]


@given(st.lists(st.sampled_from(UNICODE_CASES + [
    "\n", "\r\n", "e\u0301", "\u0301", "\u1100", "\u1161", "\u11a8", "가", "\u0b47",
    "\u0b3e", "ﬃ", "…", "，", "ｱ", "ﾟ", "\u0344", "\u0f73", "\u1e9b\u0323"]),
    max_size=40).map("".join))
def test_normalize_line_by_line_is_nfkc_of_the_whole(text):
    assert simhashdb.normalize(text) == unicodedata.normalize("NFKC", text).casefold()


def test_native_case_folding_is_str_casefold_for_every_code_point():
    every = "".join(map(chr, range(0x110000)))
    assert _text.casefold(every) == every.casefold().encode("utf-8", "surrogatepass")
    assert [cp for cp in range(0x110000) if _text.casefold(every[cp]) != every[cp].casefold(
        ).encode("utf-8", "surrogatepass")] == []


def test_weighted_words_match_the_reference_on_real_files():
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.glob("*.py"))[:40]:
        text = path.read_text("utf-8", "replace")
        assert simhashdb.fingerprint(text) == reference_weighted_words(text), path
        assert simhashdb.fingerprint_with_signature(text, signature_bits=16) == \
            old_fingerprint_with_signature(text, False), path


def test_words_every_document_has_weigh_little():
    hashes, weights, absent = _word_weights(simhashdb.fingerprint.__globals__["WORD_WEIGHTS"])
    table = dict(zip(hashes, weights))
    for word in ("the", "and", "return", "of"):
        assert table[simhashdb.fast_hash(word.encode())] < absent / 4
    assert simhashdb.fast_hash(b"zanzibar") not in table
    topic = "lmdb permutation fingerprint hamming "
    common = "the of and to in is "
    # the same frequent words around two topics do not make them alike
    a = simhashdb.fingerprint(common * 20 + topic * 2)
    b = simhashdb.fingerprint(common * 20 + "kettle teapot saucer biscuit " * 2)
    assert simhashdb.num_differing_bits(a, b) >= 16


def test_shingle_options_need_counted_shingles():
    with pytest.raises(InvalidArgumentError, match="idf=None"):
        simhashdb.fingerprint("abc", idf="words-idf-5000", window=3)
    for bad in ("no-such-table", ["words-idf-5000"], 5):
        with pytest.raises(InvalidArgumentError, match="unknown word weight table"):
            simhashdb.fingerprint("abc", idf=bad)
    assert simhashdb.fingerprint("abc def", window=3) == \
        simhashdb.fingerprint("abc def", window=3, idf=None)


def test_a_damaged_weight_table_is_refused(tmp_path, monkeypatch):
    module = sys.modules["simhashdb.fingerprint"]
    data = bytearray((module._TABLE_DIR / "words-idf.bin").read_bytes())
    data[100] ^= 1
    (tmp_path / "words-idf.bin").write_bytes(bytes(data))
    monkeypatch.setattr(module, "_TABLE_DIR", tmp_path)
    module._word_weights.cache_clear()
    try:
        with pytest.raises(simhashdb.SimhashDBError, match="damaged"):
            simhashdb.fingerprint("some text")
    finally:
        monkeypatch.undo()
        module._word_weights.cache_clear()
    assert simhashdb.fingerprint("some text") == reference_weighted_words("some text")


@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=120))
def test_the_readme_pipeline_is_simhash_pys_bit_for_bit(text):
    tokens = text.split()
    ours = simhashdb.compute([simhashdb.unsigned_hash(" ".join(s).encode("utf-8"))
                              for s in simhashdb.shingle(tokens, 4)])
    theirs = simhash_py.compute([simhash_py.unsigned_hash(" ".join(s).encode("utf-8"))
                                 for s in simhash_py.shingle(tokens, 4)])
    assert ours == theirs
