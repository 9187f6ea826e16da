/* corpus.c: the generated default corpus (see corpus.h): a seeded world of
 * facts, a small probabilistic grammar, arithmetic and counting. Everything is
 * drawn from one integer generator, so the text of a seed is the same on every
 * machine. */
#include "corpus.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* ------------------------------------------------------------ randomness */

typedef struct rng {
    uint64_t s;
} rng;

/* splitmix64: a full-period 64-bit generator with a strong output mix. */
static uint64_t rng_next(rng *r) { return tsr_splitmix_next(&r->s); }

/* below(n): uniform in [0, n) up to a bias of n / 2^64. */
static uint32_t below(rng *r, uint32_t n) { return (uint32_t)(rng_next(r) % n); }
static int chance(rng *r, uint32_t percent) { return below(r, 100) < percent; }
/* skewed(n): in [0, n), index i about harmonically more likely than i+1, so the
 * first few people and towns recur far more often than the last. */
static uint32_t skewed(rng *r, uint32_t n) { return below(r, below(r, n) + 1); }
#define PICK(r, a) ((a)[below((r), (uint32_t)COUNT(a))])

/* ---------------------------------------------------------------- words */

typedef struct name_entry {
    const char *name;
    int he; /* 1: he, 0: she */
} name_entry;

static const name_entry names[] = {
    {"Mira", 0},  {"Tomas", 1}, {"Ada", 0},   {"Bruno", 1}, {"Celia", 0}, {"Dario", 1}, {"Elena", 0}, {"Felix", 1},
    {"Greta", 0}, {"Hugo", 1},  {"Ines", 0},  {"Jonas", 1}, {"Kira", 0},  {"Leo", 1},   {"Maya", 0},  {"Nils", 1},
    {"Olga", 0},  {"Pavel", 1}, {"Rosa", 0},  {"Sami", 1},  {"Tara", 0},  {"Ugo", 1},   {"Vera", 0},  {"Wim", 1},
    {"Yara", 0},  {"Zeno", 1},  {"Alma", 0},  {"Boris", 1}, {"Clara", 0}, {"Emil", 1},  {"Fiona", 0}, {"Gideon", 1},
};

/* Nouns: "singular" or "singular/plural" when the plural is not regular. */
static const char *const trades[] = {"farmer", "baker",  "teacher",  "doctor", "sailor",   "painter",   "miller",
                                     "weaver", "smith",  "fisher",   "potter", "builder",  "singer",    "merchant",
                                     "guard",  "cook",   "nurse",    "carpenter", "gardener", "hunter"};
static const char *const animals[] = {"dog",  "cat", "horse",  "goat",       "sheep/sheep", "bird",
                                      "fox",  "cow", "pig",    "duck",       "rabbit",      "mouse/mice",
                                      "owl",  "frog", "bear",  "wolf/wolves"};
static const char *const folk[] = {"child/children", "man/men", "woman/women", "boy",     "girl",    "friend",
                                   "neighbor",       "stranger", "king",       "queen",   "soldier", "student"};
static const char *const foods[] = {"apple", "pear",  "plum",  "egg",   "cake",          "pie",
                                    "carrot", "onion", "potato/potatoes", "tomato/tomatoes", "fish/fish",
                                    "melon", "lemon", "cookie", "cherry", "bean",        "nut"};
static const char *const things[] = {"book", "letter", "basket", "box",   "lamp", "hat",   "coat",  "shoe",  "key",
                                     "cup",  "bowl",   "knife/knives", "rope", "stone", "coin", "map", "bell", "chair",
                                     "table", "boat",  "cart",   "drum",  "flute", "ring", "candle"};
static const char *const places[] = {"garden", "market", "river",  "forest",  "school",  "house",   "bridge",
                                     "field",  "hill",   "harbor", "library", "kitchen", "tower",   "village",
                                     "road",   "lake",   "farm",   "shop",    "mill",    "square"};
static const char *const colors[] = {"red", "blue", "green", "yellow", "white", "black", "brown", "gray", "golden", "silver"};
static const char *const adjectives[] = {"old",    "young", "small", "big",   "tall",  "short",  "quiet", "loud",
                                         "happy",  "sad",   "clever", "lazy", "brave", "kind",   "tired", "hungry",
                                         "warm",   "cold",  "heavy", "light", "new",   "bright", "dark",  "round",
                                         "sharp",  "soft",  "clean", "dirty", "strange", "careful"};
static const char *const adverbs[] = {"slowly", "quickly", "quietly", "happily", "carefully",
                                      "again",  "together", "early",  "late",    "alone"};
static const char *const preps[] = {"in", "at", "near", "behind", "beside", "across"};
static const char *const days[] = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};
static const char *const months[] = {"January", "February", "March",     "April",   "May",      "June",
                                     "July",    "August",   "September", "October", "November", "December"};
static const char *const number_words[] = {"zero",  "one",     "two",      "three",    "four",     "five",    "six",
                                           "seven", "eight",   "nine",     "ten",      "eleven",   "twelve",  "thirteen",
                                           "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"};

/* Verbs: "base" or "base/third-person/past" when not regular; and the kind of
 * object each takes, so that people eat food and cross rivers. */
enum { OBJ_FOOD, OBJ_THING, OBJ_LIVING, OBJ_PLACE, OBJ_NONE };
typedef struct verb {
    const char *forms;
    int obj;
} verb;
static const verb verbs[] = {
    {"eat/eats/ate", OBJ_FOOD},        {"cook", OBJ_FOOD},
    {"buy/buys/bought", OBJ_FOOD},     {"sell/sells/sold", OBJ_FOOD},
    {"bake", OBJ_FOOD},                {"wash/washes/washed", OBJ_FOOD},
    {"pick", OBJ_FOOD},                {"share", OBJ_FOOD},
    {"carry", OBJ_THING},              {"find/finds/found", OBJ_THING},
    {"hold/holds/held", OBJ_THING},    {"make/makes/made", OBJ_THING},
    {"fix/fixes/fixed", OBJ_THING},    {"paint", OBJ_THING},
    {"hide/hides/hid", OBJ_THING},     {"open", OBJ_THING},
    {"lose/loses/lost", OBJ_THING},    {"keep/keeps/kept", OBJ_THING},
    {"bring/brings/brought", OBJ_THING}, {"see/sees/saw", OBJ_LIVING},
    {"help", OBJ_LIVING},              {"call", OBJ_LIVING},
    {"meet/meets/met", OBJ_LIVING},    {"follow", OBJ_LIVING},
    {"watch/watches/watched", OBJ_LIVING}, {"teach/teaches/taught", OBJ_LIVING},
    {"thank", OBJ_LIVING},             {"greet", OBJ_LIVING},
    {"visit", OBJ_PLACE},              {"clean", OBJ_PLACE},
    {"leave/leaves/left", OBJ_PLACE},  {"reach/reaches/reached", OBJ_PLACE},
    {"cross/crosses/crossed", OBJ_PLACE}, {"sleep/sleeps/slept", OBJ_NONE},
    {"sing/sings/sang", OBJ_NONE},     {"run/runs/ran", OBJ_NONE},
    {"wait", OBJ_NONE},                {"laugh", OBJ_NONE},
    {"walk", OBJ_NONE},                {"swim/swims/swam", OBJ_NONE},
    {"dance", OBJ_NONE},               {"rest", OBJ_NONE},
    {"work", OBJ_NONE},                {"smile", OBJ_NONE},
};

/* Town and country names are made from these syllables, so each seed has its own. */
static const char *const town_head[] = {"Dun", "Ash", "Bel", "Cor", "Ell", "Fen", "Gal", "Har", "Kel", "Lor",
                                        "Mar", "Nor", "Os",  "Pel", "Ros", "Sel", "Tal", "Vel", "Wen", "Yor"};
static const char *const town_tail[] = {"more", "ford", "wick", "ton", "dale", "bury", "holm", "mouth", "stead", "gate"};
static const char *const land_head[] = {"Var", "Ost", "Bel", "Mor", "Tal", "Zen", "Ald", "Ker"};
static const char *const land_tail[] = {"nia", "land", "ora", "avia", "ica", "mark"};

/* --------------------------------------------------------- word forms */

static int ends_with(const char *w, size_t n, const char *s) {
    size_t k = strlen(s);
    return n >= k && memcmp(w + n - k, s, k) == 0;
}
static int is_vowel(char c) { return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'; }

/* field(): copies the k-th '/'-separated field of `forms` (k 0-based) into out;
 * 0 when there is no such field. */
static int field(const char *forms, int k, char *out, size_t cap) {
    const char *p = forms;
    for (int i = 0; i < k; i++) {
        p = strchr(p, '/');
        if (!p) return 0;
        p++;
    }
    size_t n = strcspn(p, "/");
    if (n >= cap) n = cap - 1;
    memcpy(out, p, n);
    out[n] = 0;
    return 1;
}

static void noun_form(const char *forms, int plural, char *out, size_t cap) {
    if (field(forms, plural, out, cap)) return;
    field(forms, 0, out, cap);
    size_t n = strlen(out);
    if (ends_with(out, n, "s") || ends_with(out, n, "x") || ends_with(out, n, "ch") || ends_with(out, n, "sh"))
        snprintf(out + n, cap - n, "es");
    else if (n > 1 && out[n - 1] == 'y' && !is_vowel(out[n - 2]))
        snprintf(out + n - 1, cap - n + 1, "ies");
    else
        snprintf(out + n, cap - n, "s");
}

/* form: 0 base ("eat"), 1 third person singular ("eats"), 2 past ("ate"). */
static void verb_form(const char *forms, int form, char *out, size_t cap) {
    if (form && field(forms, form, out, cap)) return;
    field(forms, 0, out, cap);
    size_t n = strlen(out);
    int cy = n > 1 && out[n - 1] == 'y' && !is_vowel(out[n - 2]);
    if (form == 1) {
        if (cy) snprintf(out + n - 1, cap - n + 1, "ies");
        else if (ends_with(out, n, "s") || ends_with(out, n, "x") || ends_with(out, n, "ch") || ends_with(out, n, "sh"))
            snprintf(out + n, cap - n, "es");
        else snprintf(out + n, cap - n, "s");
    } else if (form == 2) {
        if (cy) snprintf(out + n - 1, cap - n + 1, "ied");
        else if (out[n - 1] == 'e') snprintf(out + n, cap - n, "d");
        else snprintf(out + n, cap - n, "ed");
    }
}

/* -------------------------------------------------------------- output */

typedef tsr_sbuf text;

static void put_n(text *t, const char *s, size_t k) { tsr_sb_put(t, s, k); }
static void put(text *t, const char *s) { put_n(t, s, strlen(s)); }
static void putf(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(text *t, const char *fmt, ...) {
    char b[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    if (k > 0) put_n(t, b, (size_t)k < sizeof b ? (size_t)k : sizeof b - 1);
}
/* Sentences start with a capital: the byte at `at` (written since) is raised. */
static void capitalize(text *t, size_t at) {
    if (!t->oom && at < t->n && t->p[at] >= 'a' && t->p[at] <= 'z') t->p[at] = (char)(t->p[at] - 'a' + 'A');
}
/* "a" or "an" for the word that follows. */
static void put_article(text *t, const char *next) { put(t, is_vowel(next[0]) ? "an " : "a "); }

/* --------------------------------------------------------------- world */

#define N_PEOPLE ((int)COUNT(names))
#define N_TOWNS 16
#define N_LANDS 4

typedef struct person {
    const char *name;
    int he, town, trade, pet, food, color, age;
} person;

typedef struct world {
    person people[N_PEOPLE];
    char town[N_TOWNS][24], land[N_LANDS][24];
    int town_land[N_TOWNS], capital[N_LANDS];
} world;

/* shuffle(): a seeded Fisher-Yates permutation of 0..n-1 into idx. */
static void shuffle(rng *r, int *idx, int n) {
    for (int i = 0; i < n; i++) idx[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)below(r, (uint32_t)i + 1), x = idx[i];
        idx[i] = idx[j], idx[j] = x;
    }
}

static void world_make(rng *r, world *w) {
    int idx[COUNT(town_head) * COUNT(town_tail)];
    shuffle(r, idx, (int)COUNT(idx));
    for (int i = 0; i < N_TOWNS; i++)
        snprintf(w->town[i], sizeof w->town[i], "%s%s", town_head[idx[i] / (int)COUNT(town_tail)],
                 town_tail[idx[i] % (int)COUNT(town_tail)]);
    shuffle(r, idx, (int)(COUNT(land_head) * COUNT(land_tail)));
    for (int i = 0; i < N_LANDS; i++)
        snprintf(w->land[i], sizeof w->land[i], "%s%s", land_head[idx[i] / (int)COUNT(land_tail)],
                 land_tail[idx[i] % (int)COUNT(land_tail)]);
    // every country gets towns (i % N_LANDS); its first town is its capital
    for (int i = 0; i < N_TOWNS; i++) w->town_land[i] = i % N_LANDS;
    for (int c = 0; c < N_LANDS; c++) w->capital[c] = c;
    // people in a seeded order, so that who is frequent depends on the seed
    shuffle(r, idx, N_PEOPLE);
    for (int i = 0; i < N_PEOPLE; i++) {
        person *p = &w->people[i];
        p->name = names[idx[i]].name;
        p->he = names[idx[i]].he;
        p->town = (int)skewed(r, N_TOWNS);
        p->trade = (int)below(r, COUNT(trades));
        p->pet = (int)below(r, COUNT(animals));
        p->food = (int)below(r, COUNT(foods));
        p->color = (int)below(r, COUNT(colors));
        p->age = 18 + (int)below(r, 70);
    }
}

/* ------------------------------------------------------------- grammar */

typedef struct story {
    const world *w;
    const person *hero;
    int past;
} story;

/* The noun phrase of a living subject or object; returns 1 when plural. */
static int put_living(text *t, rng *r, const story *s, int allow_hero) {
    char n[32];
    uint32_t k = below(r, 100);
    if (allow_hero && k < 30) {
        put(t, s->hero->name);
        return 0;
    }
    if (k < 45) {
        const person *p;
        do p = &s->w->people[skewed(r, N_PEOPLE)];
        while (!allow_hero && p == s->hero);
        put(t, p->name);
        return 0;
    }
    const char *forms = k < 70 ? PICK(r, trades) : k < 85 ? PICK(r, animals) : PICK(r, folk);
    int plural = chance(r, 30);
    if (plural && chance(r, 50)) {
        noun_form(forms, 1, n, sizeof n);
        putf(t, "%s ", number_words[2 + below(r, 9)]);
    } else {
        noun_form(forms, plural, n, sizeof n);
        put(t, "the ");
    }
    if (chance(r, 40)) putf(t, "%s ", PICK(r, adjectives));
    put(t, n);
    return plural;
}

static void put_object(text *t, rng *r, const story *s, int kind, int allow_hero) {
    char n[32];
    if (kind == OBJ_LIVING) {
        put_living(t, r, s, allow_hero);
        return;
    }
    if (kind == OBJ_PLACE) {
        put(t, "the ");
        if (chance(r, 30)) putf(t, "%s ", PICK(r, adjectives));
        put(t, PICK(r, places));
        return;
    }
    const char *forms = kind == OBJ_FOOD ? PICK(r, foods) : PICK(r, things);
    const char *adj = chance(r, 50) ? (chance(r, 50) ? PICK(r, colors) : PICK(r, adjectives)) : NULL;
    uint32_t k = below(r, 100);
    if (k < 35) { /* "three red apples" */
        noun_form(forms, 1, n, sizeof n);
        putf(t, "%s ", number_words[2 + below(r, 11)]);
    } else if (k < 70) { /* "a red apple" */
        noun_form(forms, 0, n, sizeof n);
        put_article(t, adj ? adj : n);
    } else { /* "the apple" */
        noun_form(forms, 0, n, sizeof n);
        put(t, "the ");
    }
    if (adj) putf(t, "%s ", adj);
    put(t, n);
}

static void put_time(text *t, rng *r, int past) {
    switch (below(r, 6)) {
    case 0: putf(t, " on %s", PICK(r, days)); break;
    case 1: putf(t, " in %s", PICK(r, months)); break;
    case 2: put(t, past ? " yesterday" : " every day"); break;
    case 3: put(t, " in the morning"); break;
    case 4: put(t, " in the evening"); break;
    default: put(t, past ? " long ago" : " at night"); break;
    }
}

/* The subject of a sentence; returns 1 when plural. *hero is set when it is the
 * hero, who then is not also the object ("Yara taught Yara"). */
static int put_subject(text *t, rng *r, const story *s, int *hero) {
    uint32_t k = below(r, 100);
    *hero = k < 50;
    if (k < 35) {
        put(t, s->hero->name);
        return 0;
    }
    if (k < 50) {
        put(t, s->hero->he ? "he" : "she");
        return 0;
    }
    if (k < 55) {
        put(t, "they");
        return 1;
    }
    return put_living(t, r, s, 0);
}

static void put_verb(text *t, const verb *v, int past, int plural) {
    char f[32];
    verb_form(v->forms, past ? 2 : plural ? 0 : 1, f, sizeof f);
    put(t, f);
}

static const char *be(int past, int plural) { return past ? (plural ? "were" : "was") : (plural ? "are" : "is"); }

/* One sentence of a story, capitalised, with its full stop. */
static void put_sentence(text *t, rng *r, const story *s) {
    size_t start = t->n;
    int past = s->past;
    const person *h = s->hero;
    uint32_t k = below(r, 100);
    char n[32];
    if (k < 12) { /* a fact about the hero that stays true in every story */
        switch (below(r, 4)) {
        case 0:
            noun_form(animals[h->pet], 0, n, sizeof n);
            putf(t, "%s %s a %s %s", h->name, past ? "had" : "has", colors[h->color], n);
            break;
        case 1:
            noun_form(foods[h->food], 1, n, sizeof n);
            putf(t, "%s %s %s more than anything", h->he ? "he" : "she", past ? "liked" : "likes", n);
            break;
        case 2: putf(t, "%s %s %d years old", h->name, be(past, 0), h->age); break;
        default:
            putf(t, "%s %s in %s, a town in %s", h->name, past ? "lived" : "lives", s->w->town[h->town],
                 s->w->land[s->w->town_land[h->town]]);
            break;
        }
    } else if (k < 45) { /* subject verb object [place] [time] */
        const verb *v;
        do v = &PICK(r, verbs);
        while (v->obj == OBJ_NONE);
        int hero, pl = put_subject(t, r, s, &hero);
        put(t, " ");
        put_verb(t, v, past, pl);
        put(t, " ");
        put_object(t, r, s, v->obj, !hero);
        if (v->obj != OBJ_PLACE && chance(r, 40)) putf(t, " %s the %s", PICK(r, preps), PICK(r, places));
        if (chance(r, 35)) put_time(t, r, past);
    } else if (k < 60) { /* subject verb [adverb] [place] */
        const verb *v;
        do v = &PICK(r, verbs);
        while (v->obj != OBJ_NONE);
        int hero, pl = put_subject(t, r, s, &hero);
        put(t, " ");
        put_verb(t, v, past, pl);
        if (chance(r, 50)) putf(t, " %s", PICK(r, adverbs));
        if (chance(r, 60)) putf(t, " %s the %s", PICK(r, preps), PICK(r, places));
        if (chance(r, 30)) put_time(t, r, past);
    } else if (k < 70) { /* giving */
        int hero, pl = put_subject(t, r, s, &hero);
        putf(t, " %s ", past ? "gave" : pl ? "give" : "gives");
        put_object(t, r, s, chance(r, 50) ? OBJ_FOOD : OBJ_THING, 0);
        put(t, " to ");
        put_living(t, r, s, !hero);
    } else if (k < 80) { /* there is / there were */
        const char *forms = chance(r, 50) ? PICK(r, foods) : chance(r, 50) ? PICK(r, things) : PICK(r, animals);
        uint32_t c = 1 + below(r, 12);
        noun_form(forms, c > 1, n, sizeof n);
        putf(t, "there %s %s ", be(past, c > 1), c > 1 ? number_words[c] : is_vowel(n[0]) ? "an" : "a");
        if (chance(r, 40)) putf(t, "%s ", PICK(r, colors));
        putf(t, "%s %s the %s", n, PICK(r, preps), PICK(r, places));
    } else if (k < 90) { /* subject is adjective [because ...] */
        int hero, pl = put_subject(t, r, s, &hero);
        putf(t, " %s %s", be(past, pl), PICK(r, adjectives));
        if (chance(r, 40)) {
            put(t, " because ");
            int pl2 = put_living(t, r, s, 1);
            putf(t, " %s %s", be(past, pl2), PICK(r, adjectives));
        }
    } else { /* speech */
        putf(t, "%s said, \"", chance(r, 60) ? h->name : s->w->people[skewed(r, N_PEOPLE)].name);
        size_t q = t->n;
        switch (below(r, 3)) {
        case 0: putf(t, "we will visit the %s tomorrow", PICK(r, places)); break;
        case 1: putf(t, "i am %s today", PICK(r, adjectives)); break;
        default:
            noun_form(PICK(r, foods), 1, n, sizeof n);
            putf(t, "please bring me %s %s", number_words[2 + below(r, 9)], n);
            break;
        }
        capitalize(t, q);
        put(t, ".\"");
        capitalize(t, start);
        return;
    }
    put(t, ".");
    capitalize(t, start);
}

/* ----------------------------------------------------------- documents */

static void doc_story(text *t, rng *r, const world *w) {
    story s = {w, &w->people[skewed(r, N_PEOPLE)], chance(r, 70)};
    const person *h = s.hero;
    char n[32];
    if (chance(r, 50)) {
        putf(t, "The story of %s\n\n", h->name);
    } else {
        const char *forms = chance(r, 50) ? PICK(r, things) : PICK(r, animals);
        noun_form(forms, 0, n, sizeof n);
        putf(t, "%s and the %s %s\n\n", h->name, PICK(r, adjectives), n);
    }
    putf(t, "%s %s ", h->name, s.past ? "was" : "is");
    put_article(t, trades[h->trade]);
    putf(t, "%s who %s in %s.", trades[h->trade], s.past ? "lived" : "lives", w->town[h->town]);
    int paragraphs = 1 + (int)below(r, 3);
    for (int p = 0; p < paragraphs; p++) {
        int sentences = 2 + (int)below(r, 5);
        for (int i = 0; i < sentences; i++) {
            if (p == 0 || i > 0) put(t, " ");
            put_sentence(t, r, &s);
        }
        put(t, p + 1 < paragraphs ? "\n\n" : "\n");
    }
}

static void put_fact(text *t, rng *r, const world *w, const person *p) {
    char n[32];
    size_t start = t->n;
    switch (below(r, 8)) {
    case 0: putf(t, "%s lives in %s.", p->name, w->town[p->town]); break;
    case 1:
        putf(t, "%s is ", p->name);
        put_article(t, trades[p->trade]);
        putf(t, "%s.", trades[p->trade]);
        break;
    case 2: putf(t, "%s is %d years old.", p->name, p->age); break;
    case 3:
        noun_form(animals[p->pet], 0, n, sizeof n);
        putf(t, "%s has a %s %s.", p->name, colors[p->color], n);
        break;
    case 4:
        noun_form(foods[p->food], 1, n, sizeof n);
        putf(t, "%s likes %s.", p->name, n);
        break;
    case 5: putf(t, "the favorite color of %s is %s.", p->name, colors[p->color]); break;
    case 6: putf(t, "%s, the %s from %s, is %d.", p->name, trades[p->trade], w->town[p->town], p->age); break;
    default:
        if (chance(r, 50))
            putf(t, "%s is a town in %s.", w->town[p->town], w->land[w->town_land[p->town]]);
        else
            putf(t, "the capital of %s is %s.", w->land[w->town_land[p->town]],
                 w->town[w->capital[w->town_land[p->town]]]);
        break;
    }
    capitalize(t, start);
    put(t, "\n");
}

static void doc_facts(text *t, rng *r, const world *w) {
    if (chance(r, 60)) { /* about one person */
        const person *p = &w->people[skewed(r, N_PEOPLE)];
        putf(t, "Facts about %s\n\n", p->name);
        int k = 3 + (int)below(r, 5);
        for (int i = 0; i < k; i++) put_fact(t, r, w, p);
    } else if (chance(r, 50)) { /* about one town: who lives there */
        int town = (int)skewed(r, N_TOWNS);
        putf(t, "%s\n\n%s is a town in %s. ", w->town[town], w->town[town], w->land[w->town_land[town]]);
        int shown = 0;
        for (int i = 0; i < N_PEOPLE; i++) {
            if (w->people[i].town != town) continue;
            putf(t, "%s%s", shown ? ", " : "People who live there: ", w->people[i].name);
            shown++;
        }
        put(t, shown ? ".\n" : "Nobody we know lives there.\n");
    } else { /* mixed notes */
        put(t, "Notes\n\n");
        int k = 4 + (int)below(r, 7);
        for (int i = 0; i < k; i++) put_fact(t, r, w, &w->people[skewed(r, N_PEOPLE)]);
    }
}

static void doc_questions(text *t, rng *r, const world *w) {
    char n[32];
    int k = 3 + (int)below(r, 6);
    for (int i = 0; i < k; i++) {
        const person *p = &w->people[skewed(r, N_PEOPLE)];
        int land = w->town_land[p->town];
        switch (below(r, 7)) {
        case 0: putf(t, "Q: Where does %s live?\nA: In %s.\n", p->name, w->town[p->town]); break;
        case 1:
            putf(t, "Q: What does %s do?\nA: %s is ", p->name, p->he ? "He" : "She");
            put_article(t, trades[p->trade]);
            putf(t, "%s.\n", trades[p->trade]);
            break;
        case 2: putf(t, "Q: How old is %s?\nA: %d.\n", p->name, p->age); break;
        case 3: putf(t, "Q: What is the capital of %s?\nA: %s.\n", w->land[land], w->town[w->capital[land]]); break;
        case 4: putf(t, "Q: In which country is %s?\nA: %s.\n", w->town[p->town], w->land[land]); break;
        case 5:
            noun_form(animals[p->pet], 0, n, sizeof n);
            putf(t, "Q: What pet does %s have?\nA: A %s %s.\n", p->name, colors[p->color], n);
            break;
        default: {
            uint32_t a = below(r, 100), b = below(r, 100);
            putf(t, "Q: What is %u + %u?\nA: %u.\n", a, b, a + b);
            break;
        }
        }
    }
}

static void put_sum(text *t, rng *r) {
    uint32_t a, b;
    switch (below(r, 3)) {
    case 0:
        a = below(r, 100), b = below(r, 100);
        putf(t, "%u + %u = %u\n", a, b, a + b);
        break;
    case 1:
        a = below(r, 100), b = below(r, a + 1);
        putf(t, "%u - %u = %u\n", a, b, a - b);
        break;
    default:
        a = below(r, 13), b = below(r, 13);
        putf(t, "%u * %u = %u\n", a, b, a * b);
        break;
    }
}

static void doc_math(text *t, rng *r, const world *w) {
    char n[32];
    const person *p = &w->people[skewed(r, N_PEOPLE)];
    if (chance(r, 30)) { /* a word problem */
        uint32_t a = 2 + below(r, 20), b = 1 + below(r, 10);
        noun_form(PICK(r, foods), 1, n, sizeof n);
        if (chance(r, 50))
            putf(t, "%s has %u %s and buys %u more. Now %s has %u %s.\n", p->name, a, n, b, p->he ? "he" : "she",
                 a + b, n);
        else
            putf(t, "%s had %u %s and gave %u to %s. %s had %u %s left.\n", p->name, a + b, n, b,
                 w->people[skewed(r, N_PEOPLE)].name, p->he ? "He" : "She", a, n);
        return;
    }
    switch (below(r, 3)) {
    case 0: put(t, "Sums\n\n"); break;
    case 1: putf(t, "Exercises for %s\n\n", p->name); break;
    default: put(t, "Practice\n\n"); break;
    }
    int k = 5 + (int)below(r, 11);
    for (int i = 0; i < k; i++) put_sum(t, r);
}

static void doc_counting(text *t, rng *r) {
    switch (below(r, 4)) {
    case 0: {
        static const uint32_t steps[] = {1, 1, 2, 5, 10};
        uint32_t step = PICK(r, steps), from = below(r, 50) * step;
        uint32_t k = 5 + below(r, 11);
        putf(t, "Counting by %u from %u:", step, from);
        for (uint32_t i = 0; i < k; i++) putf(t, " %u", from + i * step);
        put(t, ".\n");
        break;
    }
    case 1: {
        uint32_t d = below(r, 7);
        putf(t, "After %s comes %s. The days of the week are", days[d], days[(d + 1) % 7]);
        for (int i = 0; i < 7; i++) putf(t, "%s %s", i ? (i == 6 ? " and" : ",") : "", days[i]);
        put(t, ".\n");
        break;
    }
    case 2: {
        uint32_t m = below(r, 12);
        putf(t, "The month after %s is %s. The months are", months[m], months[(m + 1) % 12]);
        for (int i = 0; i < 12; i++) putf(t, "%s %s", i ? "," : "", months[i]);
        put(t, ".\n");
        break;
    }
    default: {
        uint32_t a = 2 + below(r, 11);
        putf(t, "Times table of %u\n\n", a);
        for (uint32_t i = 1; i <= 10; i++)
            putf(t, "%s times %s is %u.\n", number_words[i], number_words[a], a * i); // a <= 12, i <= 10
        break;
    }
    }
}

int tsr_corpus_generate(uint64_t seed, size_t bytes, char **out, size_t *len, tsr_error *err) {
    *out = NULL;
    *len = 0;
    if (bytes > SIZE_MAX / 2) return tsr_err(err, TSR_ENOMEM, "corpus: %zu bytes is too large", bytes);
    rng r = {seed ^ 0x7e55e7a5eedull};
    world w;
    world_make(&r, &w);
    // room for all of it and the document that crosses the end, so it seldom grows
    text t = {malloc(bytes + 8192), 0, bytes + 8192, 0};
    if (!t.p) t.oom = 1;
    else t.p[0] = 0;
    while (!t.oom && t.n < bytes) {
        uint32_t k = below(&r, 100);
        if (k < 45) doc_story(&t, &r, &w);
        else if (k < 65) doc_facts(&t, &r, &w);
        else if (k < 77) doc_questions(&t, &r, &w);
        else if (k < 92) doc_math(&t, &r, &w);
        else doc_counting(&t, &r);
        char sep = TSR_CORPUS_DOC_SEP;
        put_n(&t, &sep, 1);
    }
    if (t.oom) {
        free(t.p);
        return tsr_err(err, TSR_ENOMEM, "corpus: out of memory generating %zu bytes", bytes);
    }
    t.n = bytes;
    t.p[bytes] = 0;
    *out = t.p;
    *len = bytes;
    return 0;
}
