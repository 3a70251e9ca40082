"""Write ``oscarkv/data/gazetteer.txt``: the second evaluation haystack, generated here.

Role: the synthetic tasks' figures move with the haystack (issue 17), so evaluation runs on two
of different kinds: ``eval.txt`` (Shakespeare, verse drama) and this file, modern expository
prose (a gazetteer of invented provinces, towns, rivers and trades). No public-domain prose of
another style was on the machine and nothing is downloaded, so the text is generated from
sentence templates and word lists by a seeded RNG; it is original work, dedicated to the public
domain (CC0). It holds no digits (needle values are digits) and no hyphenated words (needle keys
are hyphenated), and it shares no source with ``calibration.txt`` (Conan Doyle).

    python lab/scripts/make_prose_haystack.py   # deterministic: rewrites the same file
"""

from __future__ import annotations

import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "oscarkv" / "data" / "gazetteer.txt"
PARAGRAPHS = 440

ONSETS = ("Al", "Bar", "Cal", "Dun", "El", "Fen", "Gar", "Hal", "Is", "Kel", "Lor", "Mar", "Nor", "Or",
          "Pel", "Quen", "Ros", "Sel", "Tam", "Ul", "Ver", "Wen", "Yar", "Zan", "Brae", "Cor", "Drum", "Esk")
CODAS = ("brook", "by", "den", "dale", "ford", "gate", "ham", "holm", "ley", "mere", "mouth", "ness",
         "stead", "thorpe", "ton", "wick", "worth", "more", "combe", "field", "well", "haven", "bury")
RIVER_ENDS = ("water", "burn", "rill", "flow", "an", "ine", "ay", "ell")
TRADES = ("weaving", "tanning", "milling", "salt boiling", "rope making", "glass blowing", "brewing",
          "shipbuilding", "quarrying", "charcoal burning", "cheese making", "bell founding", "dyeing",
          "clock making", "paper making", "pottery", "smithing", "boat building", "printing", "cooperage")
CROPS = ("barley", "oats", "rye", "flax", "hops", "apples", "pears", "turnips", "beans", "cabbages",
         "plums", "cherries", "wheat", "clover", "mustard", "onions")
GOODS = ("wool", "timber", "slate", "coal", "iron", "salt", "peat", "honey", "hides", "linen", "lime",
         "granite", "copper", "tin", "cider", "dried fish", "oil", "candles")
BUILDINGS = ("a covered market", "a stone bridge of seven arches", "a granary on tall pillars",
             "a library older than the parish", "a customs house", "a windmill with canvas sails",
             "a ruined abbey", "a lighthouse", "a tollhouse", "an assembly hall", "a clock tower",
             "a ropewalk", "a free school", "a hospital for sailors", "a walled garden", "a watermill")
SEASONS = ("spring", "summer", "autumn", "winter", "the wet months", "harvest", "midwinter", "the thaw")
DIRECTIONS = ("north", "south", "east", "west", "northeast", "northwest", "southeast", "southwest")
COUNTS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "twelve", "twenty",
          "forty", "a hundred", "several hundred", "a few thousand", "nearly a thousand")
LANDS = ("low hills", "a broad marsh", "chalk downs", "heath and scrub", "dense oak woods", "a sandy coast",
         "terraced fields", "open moorland", "a narrow gorge", "reclaimed fens", "pine forest", "water meadows")
PEOPLE = ("the miller", "the harbour master", "the parish clerk", "an old surveyor", "the schoolmistress",
          "a travelling pedlar", "the ferryman", "the innkeeper", "a retired sea captain", "the town crier",
          "the keeper of the records", "a botanist from the capital")
FEASTS = ("the lantern fair", "the sheep washing", "the feast of the first catch", "the bell night",
          "the market of ribbons", "the walking of the bounds", "the apple wake", "the boat blessing")
ADJS = ("quiet", "prosperous", "windswept", "crowded", "orderly", "ancient", "modest", "busy", "sleepy",
        "handsome", "plain", "scattered", "compact", "weathered", "lively", "remote")

TEMPLATES = (
    "{Town} lies {count} miles {dir} of {town2}, on the {side} bank of the {River}.",
    "The country around {Town} is {land}, and most families keep a little ground for {crop}.",
    "Its chief trade is {trade}, which employs {count} people in the busy months.",
    "Carts leave {Town} every week with {good} and {good2}, and return with {good3}.",
    "The town is {adj} rather than {adj2}, and visitors remark on its {adj3} streets.",
    "Among its buildings the most admired is {building}, paid for by a subscription of the guilds.",
    "In {season} the {River} rises over the meadows, and the lower road is closed for {count} days.",
    "{Person} told the surveyors that {town2} was once larger than {Town}, before the harbour silted up.",
    "Every year the townsfolk keep {feast}, when the shops close at noon and the square fills with stalls.",
    "A road runs {dir} from the market cross to {town2}, passing {building} on the way.",
    "The soil is thin, so the farmers rotate {crop} with {crop2} and leave a field fallow every third year.",
    "There are {count} inns, of which the oldest stands by {building}.",
    "The {River} is navigable as far as {Town} for flat boats, which carry {good} down to the sea.",
    "Records kept by {person} show that the price of {good} doubled in a single {season}.",
    "Travellers should know that the ford below {Town} is dangerous after rain.",
    "The province of {Province} takes its name from the old family who held the manor of {Town}.",
    "Most houses are built of {material}, roofed with {roof}, and whitewashed before {feast}.",
    "The people of {Town} speak with a slow accent and are said to be careful with money.",
    "A small garrison was kept here in former times, and the barracks now serve as {building2}.",
    "{Person} keeps a register of the weather and reports that {season} is mild more often than not.",
    "From the hill above {Town} one can see {land} to the {dir} and the smoke of {town2} beyond it.",
    "The guild of {trade} meets in the upper room of the largest inn on the first day of each month.",
    "Fairs are held in {season} and in {season2}, and the second is the greater for the sale of {good}.",
    "Children are taught in {building2}, where {person} has kept the school for many years.",
    "The water of the {River} is soft and clear, which is thought to favour {trade}.",
    "Between {Town} and {town2} the land is {land}, with few farms and no village of any size.",
    "Visitors who stay longer than a day often walk out to {building} and take tea at the keeper's house.",
    "The bridge tolls were abolished a generation ago, and trade with {town2} has grown since then.",
    "It is a {adj} place in {season}, when the boats are laid up and the roads are heavy with mud.",
    "The chief landowner lives away, and the estate is managed by an agent who lodges above the bank.",
)
MATERIALS = ("grey stone", "red brick", "timber and plaster", "flint", "sandstone", "cob", "dressed granite")
ROOFS = ("slate", "thatch", "clay tiles", "stone flags", "wooden shingles")
SIDES = ("left", "right", "northern", "southern", "eastern", "western")


def _place(rng: random.Random) -> str:
    return rng.choice(ONSETS) + rng.choice(CODAS)


def _river(rng: random.Random) -> str:
    return rng.choice(ONSETS) + rng.choice(RIVER_ENDS)


def _fill(template: str, rng: random.Random, town: str, river: str, province: str) -> str:
    pick = rng.choice
    slots = {"Town": town, "town2": _place(rng), "River": river, "Province": province, "count": pick(COUNTS),
             "dir": pick(DIRECTIONS), "side": pick(SIDES), "land": pick(LANDS), "crop": pick(CROPS),
             "crop2": pick(CROPS), "trade": pick(TRADES), "good": pick(GOODS), "good2": pick(GOODS),
             "good3": pick(GOODS), "adj": pick(ADJS), "adj2": pick(ADJS), "adj3": pick(ADJS),
             "building": pick(BUILDINGS), "building2": "the " + pick(BUILDINGS).split(" ", 1)[1],
             "season": pick(SEASONS), "season2": pick(SEASONS), "person": pick(PEOPLE), "feast": pick(FEASTS),
             "material": pick(MATERIALS), "roof": pick(ROOFS)}
    slots["Person"] = slots["person"][0].upper() + slots["person"][1:]
    text = template.format(**slots)
    return text[0].upper() + text[1:]


def paragraph(rng: random.Random, province: str) -> str:
    """One entry: a town heading line and four to eight sentences about it, wrapped at ~72 columns."""
    town, river = _place(rng), _river(rng)
    sentences = [_fill(t, rng, town, river, province) for t in rng.sample(TEMPLATES, rng.randint(4, 8))]
    words, lines, line = " ".join(sentences).split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > 72:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    return f"{town.upper()}.\n" + "\n".join(lines + [line])


def gazetteer(seed: str = "oscarkv gazetteer 1") -> str:
    """The whole text for one RNG seed (the shipped file's seed by default; other seeds give development text of
    the same kind, e.g. ``lab/scripts/spec_draft_policies.py``)."""
    rng = random.Random(seed)
    parts = ["A Gazetteer of the Inland Provinces", "Compiled for travellers and merchants"]
    for i in range(PARAGRAPHS):
        if i % 20 == 0:
            province = _place(rng) + "shire"
            parts.append(f"THE PROVINCE OF {province.upper()}")
        parts.append(paragraph(rng, province))
    text = "\n\n".join(parts) + "\n"
    assert not any(c.isdigit() for c in text) and "-" not in text
    return text


def main() -> None:
    text = gazetteer()
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}: {len(text)} characters")


if __name__ == "__main__":
    main()
