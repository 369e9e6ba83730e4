"""The problem bank of code_exec: small Python functions, each with a reference solution and inputs.

Expected outputs are not written here: ``data/generate.py`` computes them by running the
reference solution on every input, so a problem can never ship a test its own reference fails.
Arguments and results are plain JSON data (lists, not tuples), because that is what crosses the
sandbox boundary, and integers stay within 64 bits (the JSON layer's range). ``SPLITS`` keeps
train and validation problems disjoint.
"""

from __future__ import annotations

import copy
import textwrap
from dataclasses import dataclass, field
from typing import Any


def code(source: str) -> str:
    """Source written indented inside the list, as the model should write it: dedented."""
    return textwrap.dedent(source).lstrip("\n")


@dataclass(frozen=True)
class Problem:
    problem_id: str
    entry_point: str
    signature: str
    description: str
    reference: str
    inputs: list[list[Any]] = field(default_factory=list)  # positional arguments of each test
    num_examples: int = 2  # how many of the tests the prompt shows as examples


PROBLEMS: list[Problem] = [
    Problem(
        "sum_of_evens",
        "sum_of_evens",
        "def sum_of_evens(nums: list[int]) -> int",
        "Return the sum of the even numbers in nums (0 when there are none).",
        code(
            """
            def sum_of_evens(nums):
                return sum(n for n in nums if n % 2 == 0)
            """
        ),
        [
            [[1, 2, 3, 4]],
            [[]],
            [[1, 3, 5]],
            [[-2, -3, 8]],
            [[0]],
            [[10, 20, 31, 41, 50]],
            [[7, 7, 7, 7, 7, 2]],
        ],
    ),
    Problem(
        "reverse_words",
        "reverse_words",
        "def reverse_words(sentence: str) -> str",
        "Return the words of sentence in reverse order, joined by single spaces. Words are "
        "separated by any run of whitespace; leading and trailing whitespace is dropped.",
        code(
            """
            def reverse_words(sentence):
                return ' '.join(reversed(sentence.split()))
            """
        ),
        [
            ["hello world"],
            ["  one   two three  "],
            [""],
            ["single"],
            ["a b c d e"],
            ["tab\tseparated\nlines"],
        ],
    ),
    Problem(
        "is_palindrome",
        "is_palindrome",
        "def is_palindrome(text: str) -> bool",
        "Return True when text reads the same backwards, ignoring case and every character that "
        "is not a letter or a digit.",
        code(
            """
            def is_palindrome(text):
                kept = [c.lower() for c in text if c.isalnum()]
                return kept == kept[::-1]
            """
        ),
        [
            ["Racecar"],
            ["hello"],
            ["A man, a plan, a canal: Panama"],
            [""],
            ["ab"],
            ["12321"],
            ["No 'x' in Nixon"],
        ],
    ),
    Problem(
        "fizzbuzz",
        "fizzbuzz",
        "def fizzbuzz(n: int) -> list[str]",
        "Return the list for 1..n where multiples of 3 are 'Fizz', multiples of 5 are 'Buzz', "
        "multiples of both are 'FizzBuzz' and other numbers are their decimal string.",
        code(
            """
            def fizzbuzz(n):
                out = []
                for i in range(1, n + 1):
                    word = ''
                    if i % 3 == 0:
                        word += 'Fizz'
                    if i % 5 == 0:
                        word += 'Buzz'
                    out.append(word or str(i))
                return out
            """
        ),
        [[5], [15], [0], [1], [3], [30]],
    ),
    Problem(
        "count_vowels",
        "count_vowels",
        "def count_vowels(text: str) -> int",
        "Return how many characters of text are vowels (a, e, i, o, u, in either case).",
        code(
            """
            def count_vowels(text):
                return sum(1 for c in text.lower() if c in 'aeiou')
            """
        ),
        [["hello"], ["AEIOU"], [""], ["rhythm"], ["Programming In Python"], ["queueing"]],
    ),
    Problem(
        "second_largest",
        "second_largest",
        "def second_largest(nums: list[int]) -> int | None",
        "Return the second largest distinct value in nums, or None when there are fewer than two "
        "distinct values.",
        code(
            """
            def second_largest(nums):
                values = sorted(set(nums))
                return values[-2] if len(values) >= 2 else None
            """
        ),
        [[[3, 1, 4, 1, 5]], [[7, 7, 7]], [[]], [[2, 9]], [[-5, -1, -3]], [[10, 10, 9, 9]], [[1]]],
    ),
    Problem(
        "run_length_encode",
        "run_length_encode",
        "def run_length_encode(text: str) -> str",
        "Encode text as runs: each maximal run of one character becomes the character followed by "
        "the run length, e.g. 'aaab' -> 'a3b1'.",
        code(
            """
            def run_length_encode(text):
                out = []
                i = 0
                while i < len(text):
                    j = i
                    while j < len(text) and text[j] == text[i]:
                        j += 1
                    out.append(text[i] + str(j - i))
                    i = j
                return ''.join(out)
            """
        ),
        [["aaab"], [""], ["abc"], ["zzzzzzzzzzzz"], ["aabbaa"], ["  x"]],
    ),
    Problem(
        "flatten",
        "flatten",
        "def flatten(nested: list) -> list",
        "Return the non-list items of nested, a list whose items may themselves be lists to any "
        "depth, in left-to-right order.",
        code(
            """
            def flatten(nested):
                out = []
                for item in nested:
                    if isinstance(item, list):
                        out.extend(flatten(item))
                    else:
                        out.append(item)
                return out
            """
        ),
        [[[1, [2, [3, [4]]]]], [[]], [[[], [[]]]], [["a", ["b", "c"], "d"]], [[1, 2, 3]], [[[[[[5]]]], 6]]],
    ),
    Problem(
        "greatest_common_divisor",
        "gcd",
        "def gcd(a: int, b: int) -> int",
        "Return the greatest common divisor of a and b, always non-negative; gcd(0, 0) is 0.",
        code(
            """
            def gcd(a, b):
                a, b = abs(a), abs(b)
                while b:
                    a, b = b, a % b
                return a
            """
        ),
        [[12, 18], [17, 5], [0, 9], [0, 0], [-24, 36], [1071, 462], [1048576, 4096]],
    ),
    Problem(
        "primes_up_to",
        "primes_up_to",
        "def primes_up_to(n: int) -> list[int]",
        "Return every prime number p with 2 <= p <= n, in increasing order.",
        code(
            """
            def primes_up_to(n):
                if n < 2:
                    return []
                sieve = [True] * (n + 1)
                sieve[0] = sieve[1] = False
                for i in range(2, int(n ** 0.5) + 1):
                    if sieve[i]:
                        for j in range(i * i, n + 1, i):
                            sieve[j] = False
                return [i for i, ok in enumerate(sieve) if ok]
            """
        ),
        [[10], [1], [2], [30], [0], [100]],
    ),
    Problem(
        "merge_intervals",
        "merge_intervals",
        "def merge_intervals(intervals: list[list[int]]) -> list[list[int]]",
        "Merge overlapping or touching closed intervals [start, end] and return them sorted by start.",
        code(
            """
            def merge_intervals(intervals):
                merged = []
                for start, end in sorted(intervals):
                    if merged and start <= merged[-1][1]:
                        merged[-1][1] = max(merged[-1][1], end)
                    else:
                        merged.append([start, end])
                return merged
            """
        ),
        [
            [[[1, 3], [2, 6], [8, 10]]],
            [[]],
            [[[5, 7], [1, 2]]],
            [[[1, 4], [4, 5]]],
            [[[1, 10], [2, 3], [4, 5]]],
            [[[3, 3]]],
        ],
    ),
    Problem(
        "word_frequencies",
        "word_frequencies",
        "def word_frequencies(text: str) -> dict[str, int]",
        "Count the words of text: a word is a maximal run of ASCII letters, compared "
        "case-insensitively and reported in lower case.",
        code(
            """
            import re

            def word_frequencies(text):
                counts = {}
                for word in re.findall('[A-Za-z]+', text):
                    key = word.lower()
                    counts[key] = counts.get(key, 0) + 1
                return counts
            """
        ),
        [["the cat and the hat"], [""], ["Hello, hello! HELLO?"], ["it's 2 o'clock"], ["a-b a_b"]],
    ),
    Problem(
        "rotate_right",
        "rotate_right",
        "def rotate_right(items: list, k: int) -> list",
        "Return items rotated k places to the right (k may be larger than the length, or negative "
        "for a left rotation).",
        code(
            """
            def rotate_right(items, k):
                if not items:
                    return []
                k %= len(items)
                return items[-k:] + items[:-k] if k else list(items)
            """
        ),
        [[[1, 2, 3, 4, 5], 2], [[], 3], [[1, 2, 3], 0], [[1, 2, 3], 4], [[1, 2, 3], -1], [["a"], 100]],
    ),
    Problem(
        "balanced_brackets",
        "balanced_brackets",
        "def balanced_brackets(text: str) -> bool",
        "Return True when the brackets (), [] and {} in text are balanced and properly nested; "
        "other characters are ignored.",
        code(
            """
            def balanced_brackets(text):
                pairs = {')': '(', ']': '[', '}': '{'}
                stack = []
                for c in text:
                    if c in '([{':
                        stack.append(c)
                    elif c in pairs:
                        if not stack or stack.pop() != pairs[c]:
                            return False
                return not stack
            """
        ),
        [["([]{})"], ["(]"], [""], ["(((("], ["a(b)c[d]{e}"], ["{[}]"], ["))"]],
    ),
    Problem(
        "to_roman",
        "to_roman",
        "def to_roman(n: int) -> str",
        "Return n (1 <= n <= 3999) in Roman numerals using subtractive notation (4 is IV, 90 is XC).",
        code(
            """
            def to_roman(n):
                table = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),
                         (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]
                out = ''
                for value, symbol in table:
                    while n >= value:
                        out += symbol
                        n -= value
                return out
            """
        ),
        [[1], [4], [9], [14], [40], [1994], [3999], [2024]],
    ),
    Problem(
        "binary_to_int",
        "binary_to_int",
        "def binary_to_int(bits: str) -> int",
        "Return the value of the binary number bits (a non-empty string of 0s and 1s) without using int().",
        code(
            """
            def binary_to_int(bits):
                value = 0
                for b in bits:
                    value = value * 2 + (b == '1')
                return value
            """
        ),
        [["0"], ["1"], ["101"], ["11111111"], ["1000000000000000000000000000000000000000"], ["0010"]],
    ),
    Problem(
        "longest_common_prefix",
        "longest_common_prefix",
        "def longest_common_prefix(words: list[str]) -> str",
        "Return the longest string that every word in words starts with ('' for an empty list).",
        code(
            """
            def longest_common_prefix(words):
                if not words:
                    return ''
                prefix = words[0]
                for w in words[1:]:
                    while not w.startswith(prefix):
                        prefix = prefix[:-1]
                return prefix
            """
        ),
        [
            [["flower", "flow", "flight"]],
            [["dog", "racecar"]],
            [[]],
            [["same", "same"]],
            [["", "a"]],
            [["abc"]],
        ],
    ),
    Problem(
        "transpose",
        "transpose",
        "def transpose(matrix: list[list[int]]) -> list[list[int]]",
        "Return the transpose of a rectangular matrix given as a list of rows ([] stays []).",
        code(
            """
            def transpose(matrix):
                return [list(col) for col in zip(*matrix)]
            """
        ),
        [[[[1, 2], [3, 4]]], [[[1, 2, 3]]], [[]], [[[1], [2], [3]]], [[[1, 2, 3], [4, 5, 6]]]],
    ),
    Problem(
        "digit_sum",
        "digit_sum",
        "def digit_sum(n: int) -> int",
        "Return the sum of the decimal digits of n, ignoring its sign.",
        code(
            """
            def digit_sum(n):
                return sum(int(d) for d in str(abs(n)))
            """
        ),
        [[0], [123], [-456], [9999999999], [1000000000000000000], [7]],
    ),
    Problem(
        "unique_in_order",
        "unique_in_order",
        "def unique_in_order(items: list) -> list",
        "Return items with consecutive duplicates collapsed to one, keeping the order.",
        code(
            """
            def unique_in_order(items):
                out = []
                for x in items:
                    if not out or out[-1] != x:
                        out.append(x)
                return out
            """
        ),
        [[[1, 1, 2, 2, 2, 3, 1]], [[]], [["a", "a", "b"]], [[5]], [[1, 2, 1, 2]]],
    ),
    Problem(
        "caesar_shift",
        "caesar_shift",
        "def caesar_shift(text: str, k: int) -> str",
        "Shift every ASCII letter of text k places forward in the alphabet (wrapping, keeping "
        "case, k may be negative); leave other characters unchanged.",
        code(
            """
            def caesar_shift(text, k):
                out = []
                for c in text:
                    if 'a' <= c <= 'z':
                        out.append(chr((ord(c) - 97 + k) % 26 + 97))
                    elif 'A' <= c <= 'Z':
                        out.append(chr((ord(c) - 65 + k) % 26 + 65))
                    else:
                        out.append(c)
                return ''.join(out)
            """
        ),
        [["abc", 1], ["xyz", 3], ["Hello, World!", 13], ["", 5], ["abc", -1], ["Zz", 52]],
    ),
    Problem(
        "max_subarray_sum",
        "max_subarray_sum",
        "def max_subarray_sum(nums: list[int]) -> int",
        "Return the largest sum of a non-empty contiguous slice of nums (nums is non-empty).",
        code(
            """
            def max_subarray_sum(nums):
                best = current = nums[0]
                for x in nums[1:]:
                    current = max(x, current + x)
                    best = max(best, current)
                return best
            """
        ),
        [[[-2, 1, -3, 4, -1, 2, 1, -5, 4]], [[1]], [[-3, -1, -2]], [[5, -1, 5]], [[0, 0, 0]]],
    ),
    Problem(
        "fibonacci",
        "fibonacci",
        "def fibonacci(n: int) -> int",
        "Return the n-th Fibonacci number, with fibonacci(0) == 0 and fibonacci(1) == 1 (0 <= n <= 90).",
        code(
            """
            def fibonacci(n):
                a, b = 0, 1
                for _ in range(n):
                    a, b = b, a + b
                return a
            """
        ),
        [[0], [1], [2], [10], [50], [90]],
    ),
    Problem(
        "count_islands",
        "count_islands",
        "def count_islands(grid: list[str]) -> int",
        "grid is a list of equal-length strings of '#' (land) and '.' (water). Return the number "
        "of islands: groups of land cells connected horizontally or vertically.",
        code(
            """
            def count_islands(grid):
                seen = set()
                count = 0
                for r, row in enumerate(grid):
                    for c, cell in enumerate(row):
                        if cell != '#' or (r, c) in seen:
                            continue
                        count += 1
                        stack = [(r, c)]
                        seen.add((r, c))
                        while stack:
                            y, x = stack.pop()
                            for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                                inside = 0 <= ny < len(grid) and 0 <= nx < len(grid[ny])
                                if inside and grid[ny][nx] == '#' and (ny, nx) not in seen:
                                    seen.add((ny, nx))
                                    stack.append((ny, nx))
                return count
            """
        ),
        [[["#..", ".#.", "..#"]], [["##", "##"]], [[]], [["...", "..."]], [["#.#.#", "#####"]], [["#"]]],
    ),
]

BY_ID = {p.problem_id: p for p in PROBLEMS}
VALIDATION_IDS = (
    "second_largest",
    "merge_intervals",
    "balanced_brackets",
    "longest_common_prefix",
    "max_subarray_sum",
    "count_islands",
)
SPLITS = {
    "validation": [BY_ID[i] for i in VALIDATION_IDS],
    "train": [p for p in PROBLEMS if p.problem_id not in VALIDATION_IDS],
}


def reference_outputs(problem: Problem) -> list[Any]:
    """Run the trusted reference solution in-process on every input (generation time only)."""
    namespace: dict[str, Any] = {"__name__": "reference"}
    exec(compile(problem.reference, f"<reference {problem.problem_id}>", "exec"), namespace)
    function = namespace[problem.entry_point]
    return [function(*copy.deepcopy(args)) for args in problem.inputs]
