"""Build the built-in benchmark suite, `speclocal/data/suite.jsonl`, deterministically.

    python -m speclocal.bench.build_suite          # rewrite the data file
    python -m speclocal.bench.build_suite --check  # exit 1 if the data file is not what this builds

The file is in Spec-Bench's `question.jsonl` format (`question_id`, `category`, `turns`), with our own
prompts. Two extra keys are ours: `"stability": "code"|"chat"` marks the two long-generation prompts of
the stability run (category `stability`, not a task category). The long-context prompts are generated
here from templates with a fixed seed, so the file can be rebuilt byte for byte.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SUITE_PATH = Path(__file__).resolve().parent.parent / "data" / "suite.jsonl"

# ---- code generation -----------------------------------------------------------------------------
CODE = [
    "Write a Python function `parse_duration(text: str) -> int` that converts ISO-8601 durations such as "
    "'P3DT4H5M' or 'PT90S' into seconds. Raise ValueError on malformed input. Include a docstring.",
    "Implement an LRU cache class in Python with `get(key)` and `put(key, value)` methods and a fixed capacity, "
    "using collections.OrderedDict. Add type hints and a short usage example.",
    "Write a JavaScript function `debounce(fn, wait, { leading = false, trailing = true } = {})` that returns a "
    "debounced version of `fn`, with a `cancel()` method. Add JSDoc comments.",
    "Write SQL for a small library database: tables for books, members and loans with primary and foreign keys, "
    "then a query that lists every overdue loan with the member's name and the book title.",
    "Write a Python script that reads a CSV file given on the command line and prints the mean, median and "
    "standard deviation of every numeric column, using only the standard library (csv, statistics, argparse).",
    "Write a Bash script that backs up a directory into a timestamped .tar.gz archive in a backup folder, keeps "
    "only the 7 newest archives, and exits with a clear message if the source directory does not exist.",
    "Write a Rust function `is_palindrome(s: &str) -> bool` that ignores case and non-alphanumeric characters, "
    "with unit tests in a `#[cfg(test)]` module.",
    "Implement a binary search tree in Python with insert, delete, contains and an in-order traversal "
    "generator. Use a Node dataclass and type hints.",
    "Write a Go HTTP server with a `/health` endpoint that returns JSON `{\"status\": \"ok\", \"uptime_seconds\": N}` "
    "and a graceful shutdown on SIGINT.",
    "Write a Python function `merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]` that "
    "merges overlapping intervals, plus pytest tests covering empty input, nested and touching intervals.",
]

# ---- code editing: the answer repeats most of the input --------------------------------------------
EDIT_SOURCES = [
    (
        "Add type hints to every function in this Python module and return the whole file, unchanged otherwise.",
        '''import math


def area_of_circle(radius):
    return math.pi * radius ** 2


def scale(values, factor):
    return [v * factor for v in values]


def mean(values):
    if not values:
        raise ValueError("mean of empty list")
    return sum(values) / len(values)


def clamp(value, low, high):
    return max(low, min(high, value))


def word_counts(text):
    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts
''',
    ),
    (
        "Rename the function `fetchUser` to `loadUser` everywhere in this JavaScript module and return the "
        "complete file.",
        '''const cache = new Map();

async function fetchUser(id) {
  if (cache.has(id)) {
    return cache.get(id);
  }
  const response = await fetch(`/api/users/${id}`);
  if (!response.ok) {
    throw new Error(`user ${id}: HTTP ${response.status}`);
  }
  const user = await response.json();
  cache.set(id, user);
  return user;
}

async function fetchTeam(ids) {
  const users = [];
  for (const id of ids) {
    users.push(await fetchUser(id));
  }
  return users;
}

function clearCache() {
  cache.clear();
}

module.exports = { fetchUser, fetchTeam, clearCache };
''',
    ),
    (
        "Replace every print call in this Python script with a call on a module-level logger "
        "(`logger = logging.getLogger(__name__)`), using info for progress and error for failures. "
        "Return the whole script.",
        '''import json
import sys
from pathlib import Path


def load_config(path):
    print(f"loading config from {path}")
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        print(f"config file {path} not found")
        return {}


def process(items, config):
    limit = config.get("limit", 10)
    print(f"processing {len(items)} items with limit {limit}")
    done = []
    for item in items[:limit]:
        if not item:
            print("skipping empty item")
            continue
        done.append(item.strip().lower())
    print(f"processed {len(done)} items")
    return done


def main():
    config = load_config(sys.argv[1] if len(sys.argv) > 1 else "config.json")
    items = sys.stdin.read().splitlines()
    for line in process(items, config):
        print(line)


if __name__ == "__main__":
    main()
''',
    ),
    (
        "Make `read_scores` raise a clear `ValueError` naming the line number when a line is malformed, instead "
        "of crashing with an IndexError. Return the whole file with only that change.",
        '''from dataclasses import dataclass


@dataclass
class Score:
    player: str
    points: int


def read_scores(path):
    scores = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(",")
            scores.append(Score(parts[0].strip(), int(parts[1])))
    return scores


def best_player(scores):
    return max(scores, key=lambda s: s.points).player


def total_points(scores):
    return sum(s.points for s in scores)


def leaderboard(scores, top=3):
    ranked = sorted(scores, key=lambda s: s.points, reverse=True)
    return [f"{i + 1}. {s.player} ({s.points})" for i, s in enumerate(ranked[:top])]
''',
    ),
    (
        "Change every `int` used for sizes and indexes in this C file to `size_t`, and return the complete file.",
        '''#include <stdlib.h>
#include <string.h>

typedef struct {
    char **items;
    int count;
    int capacity;
} StringList;

int list_init(StringList *list, int capacity) {
    list->items = malloc(sizeof(char *) * capacity);
    if (list->items == NULL) {
        return -1;
    }
    list->count = 0;
    list->capacity = capacity;
    return 0;
}

int list_push(StringList *list, const char *value) {
    if (list->count == list->capacity) {
        int new_capacity = list->capacity * 2;
        char **grown = realloc(list->items, sizeof(char *) * new_capacity);
        if (grown == NULL) {
            return -1;
        }
        list->items = grown;
        list->capacity = new_capacity;
    }
    list->items[list->count] = strdup(value);
    list->count++;
    return 0;
}

void list_free(StringList *list) {
    for (int i = 0; i < list->count; i++) {
        free(list->items[i]);
    }
    free(list->items);
}
''',
    ),
    (
        "Add a one-line docstring to every method of this class and return the whole file.",
        '''class BankAccount:
    def __init__(self, owner, balance=0.0):
        self.owner = owner
        self.balance = balance
        self.history = []

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("deposit must be positive")
        self.balance += amount
        self.history.append(("deposit", amount))

    def withdraw(self, amount):
        if amount > self.balance:
            raise ValueError("insufficient funds")
        self.balance -= amount
        self.history.append(("withdraw", amount))

    def transfer(self, other, amount):
        self.withdraw(amount)
        other.deposit(amount)

    def statement(self):
        lines = [f"Account of {self.owner}"]
        for kind, amount in self.history:
            lines.append(f"{kind:>10} {amount:10.2f}")
        lines.append(f"{'balance':>10} {self.balance:10.2f}")
        return "\\n".join(lines)
''',
    ),
    (
        "Convert this Python function from using `os.path` to `pathlib.Path`, keeping its behaviour. Return the "
        "whole file.",
        '''import os
import shutil


def organise_downloads(folder):
    moved = 0
    for name in os.listdir(folder):
        source = os.path.join(folder, name)
        if not os.path.isfile(source):
            continue
        extension = os.path.splitext(name)[1].lower().lstrip(".") or "other"
        target_dir = os.path.join(folder, extension)
        if not os.path.isdir(target_dir):
            os.makedirs(target_dir)
        shutil.move(source, os.path.join(target_dir, name))
        moved += 1
    return moved
''',
    ),
]

# ---- JSON extraction ------------------------------------------------------------------------------
JSON = [
    "Extract the invoice data from this email as JSON with keys invoice_number, date (YYYY-MM-DD), vendor, "
    "currency, total and items (list of {description, quantity, unit_price}). Output only the JSON.\n\n"
    "Hello, please find our invoice INV-2024-0387 dated 14 March 2024 from Nordlicht Office Supplies. It covers "
    "12 packs of A4 paper at 4.50 EUR each, 3 toner cartridges at 61.00 EUR each and one desk lamp at 39.90 EUR. "
    "The total due is 276.90 EUR, payable within 30 days. Kind regards, Jana",
    "Read this job posting and return JSON with keys title, company, location, remote (true/false), "
    "salary_min, salary_max, currency and skills (list of strings). Output only the JSON.\n\n"
    "Brightwave Analytics is hiring a Senior Data Engineer for its Rotterdam office (hybrid, two days remote a "
    "week). You will build streaming pipelines with Kafka and Spark, model data in dbt and keep our Postgres "
    "warehouse healthy. Salary 68,000 to 82,000 euros depending on experience. Python and SQL are a must; "
    "Terraform is a plus.",
    "Turn these meeting notes into a JSON list of action items, each {owner, task, due} with due as YYYY-MM-DD "
    "or null. Output only the JSON.\n\n"
    "Weekly sync, 2 May 2024. Priya will send the revised budget to finance by Friday 10 May. Tom needs to fix "
    "the login timeout bug before the release on 15 May. Nobody owns the onboarding docs yet; Alex agreed to "
    "draft an outline, no date set. Maria will book the venue for the June offsite by 20 May.",
    "Extract a JSON object with keys product, rating (1-5), pros (list), cons (list) and sentiment "
    "(positive/neutral/negative) from this review. Output only the JSON.\n\n"
    "I've had the TrailMaster 40L backpack for three months now. The hip belt is really comfortable and the "
    "rain cover saved my laptop twice. The side pockets are too shallow for a water bottle though, and one "
    "zipper started to stick after a few weeks. Overall I'd give it four stars and would buy it again.",
    "Convert this bug report into JSON with keys title, component, severity (low/medium/high/critical), "
    "version, steps (list), expected and actual. Output only the JSON.\n\n"
    "Since updating to version 3.8.1 the export dialog crashes the whole editor. Open any project, choose "
    "File > Export, pick PDF and press Save: the app freezes and closes. I expected a PDF on my desktop; "
    "instead I lose all unsaved work. This blocks our weekly reports, so it is pretty severe.",
    "Extract the event details as JSON with keys name, date (YYYY-MM-DD), start_time (HH:MM), venue, city, "
    "price_eur and speakers (list of {name, topic}). Output only the JSON.\n\n"
    "Join us for PyData Lakeside on Saturday 21 September 2024 at the Old Harbour Hall in Lucerne. Doors open "
    "at 9:30. Tickets cost 45 euros. Talks: Lena Brandt on forecasting with gradient boosting, Omar Haddad on "
    "testing data pipelines, and Sofia Marin on privacy-preserving analytics.",
    "Parse these customer records into a JSON array of {name, email, phone, city, country}; use null for "
    "missing fields. Output only the JSON.\n\n"
    "1) Karl Jensen, karl.jensen@example.dk, +45 20 11 22 33, Aarhus, Denmark. 2) Ana Ruiz - lives in Seville, "
    "Spain - ana.ruiz@example.es, no phone given. 3) Mei Chen, phone +65 6123 4567, Singapore; email "
    "mei.chen@example.sg.",
]

# ---- factual chat Q&A -----------------------------------------------------------------------------
QA = [
    "Why is the sky blue during the day but red and orange at sunset?",
    "What causes the seasons on Earth? Many people think it is the distance to the Sun: is that right?",
    "What is the difference between a virus and a bacterium, and why do antibiotics only work on one of them?",
    "How does a household refrigerator keep food cold? Explain the refrigeration cycle simply.",
    "Why was the invention of the printing press so important for Europe in the 15th and 16th centuries?",
    "How do vaccines train the immune system, and what is the difference between mRNA and inactivated vaccines?",
    "What is inflation, and how do central banks try to control it with interest rates?",
]

# ---- creative writing -----------------------------------------------------------------------------
CREATIVE = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle addressed to her by name.",
    "Write a poem about a rainy autumn evening in a big city, with vivid images and no rhyme.",
    "Write a playful product description for a handmade ceramic coffee mug with a chipped, lopsided charm.",
    "Write the opening page of a mystery novel that begins in a nearly empty train station at midnight.",
    "Write a fable in which an impatient young fox learns the value of waiting from an old tortoise.",
    "Write a letter from a time traveller to their twelve-year-old self, full of advice and small secrets.",
]

# ---- multi-turn conversations (three turns, run turn by turn) ---------------------------------------
MULTI = [
    ["Write a Python function that checks whether a number is prime.",
     "Now make it fast for numbers up to 10**12.",
     "Add pytest tests for it, including edge cases like 0, 1, 2 and a large prime."],
    ["I am planning three days in Lisbon in October. Suggest an itinerary.",
     "I don't enjoy museums. Change day two so it has none.",
     "Summarise the final plan as a short bulleted list, one line per activity."],
    ["Give me a recipe for a vegetarian lasagna for four people.",
     "Make it vegan, and tell me what to use instead of the cheese.",
     "Write the shopping list for the vegan version as JSON, grouped by supermarket section."],
    ["Explain what a hash table is to a junior developer.",
     "How does it deal with collisions?",
     "Compare it with a balanced binary search tree in a small markdown table."],
]

# ---- editing sessions: one file, several edits in a row, the whole file back each time ------------------
# Run turn by turn like the multi-turn conversations: each turn's prompt holds the file as the previous
# answer left it, and the answer re-emits it with one more change (how people iterate on code).
EDITING_SESSIONS = [
    (
        "orders.py",
        "python",
        """def total(items):
    result = 0
    for item in items:
        result += item["price"] * item["qty"]
    return result


def apply_discount(amount, percent):
    return amount - amount * percent / 100


def summary(items):
    t = total(items)
    return f"{len(items)} items, total {t:.2f}"
""",
        ["Rename the function `total` to `order_total` everywhere in this file and return the whole file.",
         "Add a parameter `tax_rate=0.0` to `order_total` that adds that share of tax to the result. Return the "
         "whole updated file.",
         "Make `apply_discount` raise a `ValueError` when `percent` is not between 0 and 100. Return the whole "
         "file.",
         "Add a one-line docstring to every function. Return the complete file."],
    ),
    (
        "cart.js",
        "javascript",
        """class Cart {
  constructor() {
    this.lines = [];
  }

  add(sku, price, qty) {
    this.lines.push({ sku, price, qty });
  }

  remove(sku) {
    this.lines = this.lines.filter((line) => line.sku !== sku);
  }

  total() {
    return this.lines.reduce((sum, line) => sum + line.price * line.qty, 0);
  }
}

module.exports = { Cart };
""",
        ["Rename the method `add` to `addItem` in this JavaScript file and return the whole file.",
         "Give `addItem` a default of 1 for `qty`. Return the complete updated file.",
         "Make `addItem` throw an Error when `price` is negative. Return the whole file.",
         "Add a JSDoc comment above every method. Return the whole file."],
    ),
    (
        "temperature.py",
        "python",
        """class TemperatureLog:
    def __init__(self):
        self.readings = []

    def record(self, value):
        self.readings.append(value)

    def average(self):
        return sum(self.readings) / len(self.readings)

    def highest(self):
        return max(self.readings)

    def above(self, limit):
        return [r for r in self.readings if r > limit]
""",
        ["Add type hints to every method of this class and return the whole file.",
         "Add a parameter `unit: str = \"C\"` to `__init__`, stored on the instance. Return the complete file.",
         "Make `average` and `highest` raise a `ValueError` with a clear message when there are no readings. "
         "Return the whole file.",
         "Add a docstring to the class and to every method. Return the whole updated file."],
    ),
    (
        "inventory.go",
        "go",
        """package inventory

type Item struct {
	Name  string
	Count int
}

type Store struct {
	items map[string]Item
}

func NewStore() *Store {
	return &Store{items: map[string]Item{}}
}

func (s *Store) Put(name string, count int) {
	s.items[name] = Item{Name: name, Count: count}
}

func (s *Store) Take(name string, count int) {
	item := s.items[name]
	item.Count -= count
	s.items[name] = item
}
""",
        ["Rename the method `Put` to `Add` in this Go file and return the whole file.",
         "Make `Take` return an error when the item is missing or there are not enough of it. Return the "
         "complete file.",
         "Add a method `Count(name string) int` after `Take`. Return the whole file.",
         "Add a doc comment above every exported type, function and method. Return the whole file."],
    ),
]

# ---- stability: prompts that ask for long outputs (n >= 512) -----------------------------------------
STABILITY = {
    "code": "Write a complete, well-documented Python module for a command-line to-do list manager: argparse "
            "subcommands add, list, done and remove; storage in a JSON file; a Task dataclass; docstrings on "
            "every function; then a full pytest test suite for it.",
    "chat": "Write a detailed guide, at least 1200 words with several sections, for an adult beginner who wants "
            "to start running: motivation, equipment, a first eight-week plan, avoiding injuries, nutrition, "
            "and how to stay consistent.",
}


# ---- long context: generated deterministically ---------------------------------------------------------
def long_code_module(rng: random.Random, n_funcs: int) -> str:
    """A plausible Python inventory module of `n_funcs` helper functions plus a store class."""
    fields = ["price", "weight", "quantity", "volume", "discount", "tax_rate"]
    groups = ["category", "supplier", "warehouse", "region", "brand"]
    out = ['"""Inventory helpers: totals, filters and a small in-memory store."""', "",
           "from __future__ import annotations", "", "from dataclasses import dataclass, field", "", "",
           "@dataclass", "class Item:", "    sku: str", "    name: str"]
    out += [f"    {g}: str" for g in groups]
    out += [f"    {f}: float = 0.0" for f in fields]
    out += ["    tags: list[str] = field(default_factory=list)", "", ""]
    combos = [(f, g) for f in fields for g in groups]
    rng.shuffle(combos)
    kinds = ["total", "above", "average", "max"]
    for i in range(n_funcs):
        f, g = combos[i % len(combos)]
        kind = kinds[i % len(kinds)]
        if kind == "total":
            out += [f"def total_{f}_by_{g}(items: list[Item]) -> dict[str, float]:",
                    f'    """Sum of {f} for each {g}."""',
                    "    totals: dict[str, float] = {}",
                    "    for item in items:",
                    f"        totals[item.{g}] = totals.get(item.{g}, 0.0) + item.{f}",
                    "    return totals"]
        elif kind == "above":
            limit = rng.choice([5, 10, 25, 50, 100, 250])
            out += [f"def items_with_{f}_above(items: list[Item], limit: float = {limit}) -> list[Item]:",
                    f'    """Items whose {f} is above `limit`, highest first."""',
                    f"    chosen = [item for item in items if item.{f} > limit]",
                    f"    return sorted(chosen, key=lambda item: item.{f}, reverse=True)"]
        elif kind == "average":
            out += [f"def average_{f}_in_{g}(items: list[Item], {g}: str) -> float | None:",
                    f'    """Mean {f} of the items in one {g}, or None if there are none."""',
                    f"    values = [item.{f} for item in items if item.{g} == {g}]",
                    "    return sum(values) / len(values) if values else None"]
        else:
            out += [f"def max_{f}_per_{g}(items: list[Item]) -> dict[str, Item]:",
                    f'    """The item with the largest {f} in each {g}."""',
                    "    best: dict[str, Item] = {}",
                    "    for item in items:",
                    f"        current = best.get(item.{g})",
                    f"        if current is None or item.{f} > current.{f}:",
                    f"            best[item.{g}] = item",
                    "    return best"]
        out += ["", ""]
    out += ["class InventoryStore:",
            '    """Items by SKU, with simple queries."""', "",
            "    def __init__(self) -> None:",
            "        self._items: dict[str, Item] = {}", "",
            "    def add(self, item: Item) -> None:",
            "        if item.sku in self._items:",
            '            raise KeyError(f"duplicate sku {item.sku}")',
            "        self._items[item.sku] = item", "",
            "    def remove(self, sku: str) -> Item:",
            "        return self._items.pop(sku)", "",
            "    def get(self, sku: str) -> Item | None:",
            "        return self._items.get(sku)", "",
            "    def all(self) -> list[Item]:",
            "        return list(self._items.values())", "",
            "    def tagged(self, tag: str) -> list[Item]:",
            "        return [item for item in self._items.values() if tag in item.tags]", ""]
    return "\n".join(out)


def long_report(rng: random.Random, n_sections: int) -> str:
    """A quarterly status report of a fictional company, one section per department."""
    depts = ["Engineering", "Sales", "Marketing", "Customer Support", "Finance", "Human Resources", "Logistics",
             "Procurement", "Legal", "Research", "Facilities", "Security", "Data Platform", "Design",
             "Quality Assurance", "Internal Audit", "Sustainability", "IT Operations", "Partnerships", "Training"]
    people = ["Amara Okafor", "Lukas Weber", "Sofia Rossi", "Kenji Tanaka", "Priya Nair", "Mateo Silva",
              "Hannah Berg", "Omar Haddad", "Chloe Martin", "Ivan Petrov", "Leila Rahimi", "Daniel Kim"]
    projects = ["the customer portal rebuild", "the warehouse automation pilot", "the pricing review",
                "the new onboarding programme", "the data retention policy", "the partner API",
                "the office move", "the supplier consolidation", "the mobile app redesign",
                "the quarterly forecasting model", "the support chatbot trial", "the SOC 2 audit"]
    risks = ["a key supplier may raise prices by up to 12 percent", "two senior engineers are leaving",
             "the vendor contract expires before the replacement is ready", "customer churn rose in the north region",
             "the budget for cloud costs is already 80 percent spent", "a regulatory change may delay the launch",
             "the hiring pipeline is too thin for the planned growth", "a legacy system has no maintainer",
             "shipping times from Asia have doubled", "the security review found unpatched servers"]
    lines = ["Northwind Components Ltd. - Quarterly Status Report, Q3 2024", "",
             "This report collects the status updates of every department for the third quarter. Each section "
             "lists headcount, budget use, the main projects, and the risks the department sees, with an owner "
             "for each risk.", ""]
    for i, dept in enumerate(depts[:n_sections]):
        lead = people[i % len(people)]
        head = rng.randint(6, 60)
        budget = rng.randint(55, 104)
        p1, p2 = rng.sample(projects, 2)
        r1, r2 = rng.sample(risks, 2)
        o1, o2 = rng.sample(people, 2)
        done = rng.randint(20, 95)
        lines += [f"{i + 1}. {dept}", "",
                  f"{dept} is led by {lead} and has {head} people. It used {budget} percent of its quarterly "
                  f"budget. Its main project this quarter was {p1}, which is about {done} percent complete; "
                  f"work also continued on {p2}. The team reports that collaboration with other departments "
                  f"improved, although handovers still take longer than planned and some meetings could be "
                  f"replaced by written updates. Key figures: {rng.randint(3, 40)} open tickets, an average "
                  f"response time of {rng.randint(2, 48)} hours, and a satisfaction score of "
                  f"{rng.randint(60, 95)} out of 100 in the internal survey.",
                  f"Risks: first, {r1} (owner: {o1}); second, {r2} (owner: {o2}). "
                  f"{lead} expects {'to stay within budget' if budget < 95 else 'to ask for additional budget'} "
                  f"next quarter and plans to {'hire ' + str(rng.randint(1, 5)) + ' people' if head < 30 else 'keep headcount flat'}.",
                  ""]
    lines += ["Summary of the finance team: overall spending is within the annual plan, but three departments "
              "are close to their limits. The board will review the risk register in its next meeting."]
    return "\n".join(lines)


def build() -> list[dict]:
    rows: list[dict] = []

    def add(category: str, turns: list[str], qid: str | None = None, **extra) -> None:
        rows.append({"question_id": qid or f"{category}-{sum(r['category'] == category for r in rows) + 1}",
                     "category": category, "turns": turns, **extra})

    for p in CODE:
        add("code", [p])
    for instruction, source in EDIT_SOURCES:
        add("code-edit", [f"{instruction}\n\n```\n{source}```"])
    for p in JSON:
        add("json", [p])
    for p in QA:
        add("qa", [p])
    for p in CREATIVE:
        add("creative", [p])
    for turns in MULTI:
        add("multi-turn", turns)
    for name, language, source, edits in EDITING_SESSIONS:
        first = f"{edits[0]}\n\n`{name}`:\n```{language}\n{source}```"
        add("editing-session", [first, *edits[1:]])
    rng = random.Random(20240501)
    add("long-context", [
        "Rename the class `InventoryStore` to `StockRegistry` in this module and return the whole module, "
        "otherwise unchanged.\n\n```python\n" + long_code_module(rng, 27) + "```"])
    add("long-context", [
        long_report(rng, 20) + "\n\nSummarise this report for the board in at most eight bullet points, then list "
        "every risk mentioned together with its owner."])
    add("long-context", [
        "Review this module. List every function that can raise an exception or return None, with the reason, "
        "then write pytest tests for `InventoryStore`.\n\n```python\n" + long_code_module(rng, 24) + "```"])
    add("long-context", [
        long_report(rng, 13) + "\n\nWhich departments expect to ask for additional budget, and which plan to "
        "hire? Answer as a Markdown table with the department, its lead, its budget use and its plan."])
    for kind, prompt in STABILITY.items():
        add("stability", [prompt], qid=f"stability-{kind}", stability=kind)
    return rows


def render() -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in build())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in argv:
        ok = SUITE_PATH.is_file() and SUITE_PATH.read_text(encoding="utf-8") == text
        print(f"{SUITE_PATH}: {'up to date' if ok else 'OUT OF DATE (run python -m speclocal.bench.build_suite)'}")
        return 0 if ok else 1
    SUITE_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {len(build())} questions to {SUITE_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
