"""What the RLHF experiments share: their prompt sets and the best-of-n math.

The held-out prompts are ppo_rlhf_gpt2.EVAL_PROMPTS and MORE_EVAL_PROMPTS below, 64 distinct movie-review openings
that neither the preference files (ppo_rlhf_gpt2.PROMPTS) nor PPO's training use: rlhf_overoptimization.py's
best-of-n prompts and rlhf_frontier.py's first test set. FRESH_TEST_PROMPTS and VALIDATION_PROMPTS, 64 each:
rlhf_frontier.py's test set of its search and the set its tuning reads.

Best-of-n keeps the response the proxy ranks highest among n. Its expected proxy and gold over all n-subsets of a
prompt's N samples: sort by proxy, the i-th best (from 1) is the subset's best with probability
C(N - i, n - 1) / C(N, n); tied proxies share their weights equally (the expectation under random tie-breaking).
Its KL to the initial policy is at most log n - (n - 1) / n nats (Stiennon et al. 2020 and Gao et al. 2022 use it
as the KL; Beirami et al. 2024 show it is an upper bound).
"""

import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
import ppo_rlhf_gpt2 as rlhf  # noqa: E402


def best_of_n_weights(num_samples: int, n: int) -> np.ndarray:
    """P(the i-th best of N samples is the best of a uniformly random n-subset), i = 1..N:
    C(N - i, n - 1) / C(N, n)."""
    total = math.comb(num_samples, n)
    return np.array([math.comb(num_samples - i, n - 1) / total for i in range(1, num_samples + 1)])


def best_of_n(proxy: np.ndarray, gold: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Expected proxy and gold of the proxy's best among n, over all n-subsets of each row's N samples
    (rows: prompts); equal proxies share their weights (random tie-breaking). Returns one value per row."""
    weights = best_of_n_weights(proxy.shape[1], n)
    proxy_best, gold_best = [], []
    for p, g in zip(proxy, gold):
        order = np.argsort(-p, kind="stable")
        p, g = p[order], g[order]
        _, group, counts = np.unique(p, return_inverse=True, return_counts=True)
        w = (np.bincount(group, weights=weights) / counts)[group]  # each tie group's mean weight
        proxy_best.append(w @ p)
        gold_best.append(w @ g)
    return np.array(proxy_best), np.array(gold_best)


def best_of_n_kl(n) -> np.ndarray:
    """log n - (n - 1) / n nats: an upper bound on KL(best-of-n || initial policy) (Beirami et al. 2024),
    reached when the proxy's scores are all distinct and the samples continuous; Gao et al.'s best-of-n KL."""
    n = np.asarray(n, dtype=np.float64)
    return np.log(n) - (n - 1) / n


def load_eval_prompts(prompts_file: str | None, num_prompts: int) -> list[str]:
    """num_prompts held-out prompts, cycled from the 64 (or from a file's, one a line)."""
    prompts = list(rlhf.EVAL_PROMPTS) + MORE_EVAL_PROMPTS
    if prompts_file is not None:
        if not os.path.isfile(prompts_file):
            raise SystemExit(f"error: --prompts-file {prompts_file}: no such file")
        prompts = [line.strip() for line in open(prompts_file) if line.strip()]
        if not prompts:
            raise SystemExit(f"error: --prompts-file {prompts_file} contains no prompts")
    return [prompts[i % len(prompts)] for i in range(num_prompts)]


# More held-out openings of movie reviews, written for rlhf_overoptimization.py (with ppo_rlhf_gpt2.EVAL_PROMPTS: 64
# distinct prompts that neither the proxies' comparisons nor PPO's training used).
MORE_EVAL_PROMPTS = [
    "The opening title sequence", "My little brother begged to see this, and",
    "The second film in the series", "The festival crowd around me", "This black-and-white drama",
    "The hero's best friend", "Every critic I read before going in", "The set pieces on the train",
    "Nothing prepared me for how the film", "The war veteran at the heart of the story",
    "This coming-of-age tale", "The dubbing in the version I saw",
    "My book club picked the adaptation because", "The road trip that takes up most of the film",
    "This documentary about a chess prodigy", "The courtroom scenes in the last hour",
    "Halfway through the second act,", "The costumes in this period piece", "The director's cameo",
    "This slasher from the eighties", "The score by a young composer", "My teenage daughter thought the film",
    "The monster itself", "The quiet scenes between mother and son", "This heist comedy",
    "The political subplot", "Three hours is a long time, and this film",
    "The animated short before the feature", "The final shot of the city", "This western set in the snow",
    "The lead actor's accent", "The sequel nobody asked for", "The jokes in the first ten minutes",
    "This film about a small bakery", "The night scenes in the forest",
    "When the lights came up, the audience", "The villain's motive", "This remake of a foreign thriller",
    "The love triangle", "The pacing of the middle hour", "This musical biopic", "The dog in this movie",
    "The scenes on the spaceship", "Watching this on a plane,", "This film about two rival chefs",
    "The flashbacks to the war", "The ending everyone is talking about", "The first time the hero speaks,",
]


# The frontier's fresh test prompts: 64 more openings, written before any run of the search (protocol.py's) and
# read by no run before its grids were fixed; rlhf_frontier.py's split "fresh". Distinct from every other prompt
# list here, and in ppo_rlhf_gpt2.py (a test checks).
FRESH_TEST_PROMPTS = [
    "The narrator's voice over the opening shots", "My neighbor recommended this film, and",
    "The fourth installment of the saga", "The crowd at the drive-in", "This noir shot in color",
    "The heroine's younger sister", "Every trailer I saw on television", "The chase across the rooftops",
    "Nothing about the poster suggested that the film", "The retired spy who narrates the story",
    "This tale of two brothers", "The closed captions on the stream I watched",
    "My history teacher showed us this because",
    "The voyage that fills the last third of the film", "This documentary about a marathon runner",
    "The prison scenes in the second half", "Somewhere in the middle of the third act,",
    "The makeup in this fantasy epic",
    "The film's long tracking shot", "This puppet film for adults", "My older cousin thought the movie",
    "The creature in the basement", "The arguments between father and daughter", "This caper set in Rome",
    "The subplot about the election", "Two and a half hours later, the film",
    "The newsreel they played before the feature",
    "The final shot of the mountains", "This western about a cattle drive", "The villain's laugh",
    "The remake that arrived twenty years late", "The slapstick in the first reel", "This film about a tiny bookshop",
    "The storm sequence at sea", "When the credits rolled, my friends", "The flashback to the villain's childhood",
    "This version of an old opera", "The rivalry between the two singers", "The rhythm of the first hour",
    "This biopic of a chess champion", "The horse in this film", "The scenes on the submarine",
    "Watching this on a laptop,", "This film about two rival tailors", "The dream sequences",
    "The twist everyone warned me about", "The first time the ghost appears,", "My film club voted for this because",
    "The movie's long silences", "This animated feature about a fox", "The choreography of the fights",
    "The director's third feature", "The cameo by a famous singer", "This road movie across Canada",
    "Once the lights went down, the film", "The courtroom drama at the center of the plot", "The wedding scene",
    "This thriller about a missing painting", "The twins who play the leads", "The last ten minutes of the film",
    "This quiet drama about a fisherman", "The mystery of the locked room", "My date and I agreed that this movie",
    "The opening scene at the airport",
]

# Validation openings of movie reviews, written for rlhf_frontier.py's tuning: none is a training prompt
# (ppo_rlhf_gpt2.PROMPTS, the preference file's) or a test prompt (the 64 above); a test keeps them apart.
VALIDATION_PROMPTS = [
    "The poster for this film promised", "I caught the matinee on a Tuesday and", "The opening monologue",
    "My uncle, who hates musicals,", "The car chase through the market", "This thriller set on an island",
    "Ten minutes after the credits, I", "The producers of this sequel", "Among this year's comedies, this one",
    "The first-time screenwriter", "This disaster movie", "The romance between the two strangers",
    "Seeing it on the big screen again,", "The minor characters", "This film about a lighthouse keeper",
    "The climactic duel", "The prologue in the desert", "My roommate insisted we watch this, and",
    "The third entry in the franchise", "The audience at the premiere", "This silent film",
    "The detective's partner", "Every review I had skimmed", "The scenes in the old mansion",
    "Nothing in the trailer hinted that the film", "The retired boxer at the center of the plot",
    "This story of first love", "The subtitles on my copy", "My film class watched this because",
    "The train journey that frames the story", "This documentary about a jazz drummer",
    "The hospital scenes near the end", "Just before the intermission,", "The wigs in this costume drama",
    "The writer's own small role", "This zombie picture from the seventies", "The orchestral score",
    "My ten-year-old nephew said the film", "The robot sidekick", "The long silences between the sisters",
    "This caper about a stolen painting", "The corporate intrigue", "Two and a half hours later, this film",
    "The cartoon that played before it", "The last image of the harbor", "This western set in the desert",
    "The star's attempt at a new accent", "The prequel that explains nothing", "The gags in the opening scene",
    "This film about a family vineyard", "The underwater sequences", "When the film ended, the theater",
    "The antagonist's backstory", "This adaptation of a stage play", "The rivalry between the brothers",
    "The tempo of the final act", "This biopic of a singer", "The cat in this film", "The scenes on the moon",
    "Watching this on a small laptop,", "This film about two rival florists", "The memories of the summer camp",
    "The plot twist in the second hour", "The first time the heroine sings,",
]
