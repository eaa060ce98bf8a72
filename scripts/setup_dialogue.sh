#!/usr/bin/env bash
# Set up the dialogue metrics (F1, ROUGE, METEOR, BLEU) with no download at run time:
#   1. pip-installs the project's `dialogue` extra (nltk, rouge-score, sacrebleu);
#   2. apt-installs WordNet 3.0 from Debian (wordnet-base, wordnet-sense-index);
#   3. copies the WordNet files to where nltk looks: $NLTK_DATA/corpora/wordnet
#      (default /usr/local/share/nltk_data, one of nltk's default search paths; 34 MB), and
#      writes the `lexnames` file nltk needs and the Debian packages lack.
# Idempotent: run it again and it changes nothing. Needs root (or sudo) for apt-get and for the
# default NLTK_DATA; set NLTK_DATA to a writable directory otherwise (nltk reads $NLTK_DATA too).
#
#   bash scripts/setup_dialogue.sh
#   NLTK_DATA=$HOME/nltk_data bash scripts/setup_dialogue.sh
set -eu

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
WORDNET_DIR="${WORDNET_DIR:-/usr/share/wordnet}"    # where the Debian packages put the database
# NLTK_DATA may list several directories (like PATH): the first one is used
NLTK_DIR="$(printf '%s' "${NLTK_DATA:-/usr/local/share/nltk_data}" | cut -d: -f1)"
WORDNET_FILES="adj.exc adv.exc cntlist cntlist.rev data.adj data.adv data.noun data.verb
index.adj index.adv index.noun index.verb index.sense noun.exc verb.exc"

# 1. the Python packages
"$PYTHON" -m pip install -q -e ".[dialogue]"

# 2. the WordNet 3.0 database (skipped when the files are already there)
missing=""
for name in $WORDNET_FILES; do
    [ -f "$WORDNET_DIR/$name" ] || missing="$missing $name"
done
if [ -n "$missing" ]; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || {
            echo "setup_dialogue: installing WordNet needs root (apt-get); missing:$missing" >&2
            exit 1
        }
        SUDO="sudo"
    fi
    packages="wordnet-base wordnet-sense-index"
    # the package lists may be empty on a fresh machine: update them only if the install fails
    # shellcheck disable=SC2086
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $packages \
        || { $SUDO apt-get update -q \
             && $SUDO env DEBIAN_FRONTEND=noninteractive \
                apt-get install -y -q --no-install-recommends $packages; }
    for name in $WORDNET_FILES; do
        [ -f "$WORDNET_DIR/$name" ] || {
            echo "setup_dialogue: $WORDNET_DIR/$name is still missing after apt-get" >&2
            exit 1
        }
    done
fi

# 3. the nltk layout: copies of the Debian files (not symlinks: nltk 3.10 refuses to read a
#    corpus file that resolves outside its corpus directory), plus lexnames
TARGET="$NLTK_DIR/corpora/wordnet"
mkdir -p "$TARGET"
for name in $WORDNET_FILES; do
    if [ -L "$TARGET/$name" ] || ! cmp -s "$WORDNET_DIR/$name" "$TARGET/$name"; then
        rm -f "$TARGET/$name"
        cp "$WORDNET_DIR/$name" "$TARGET/$name"
        chmod 644 "$TARGET/$name"
    fi
done
# lexnames: the 45 lexicographer files, as documented in WordNet 3.0's lexnames(5WN) man page
# (fields: two-digit file number, file name, syntactic category 1 noun 2 verb 3 adjective 4 adverb)
lexnames="$(mktemp)"
n=0
for entry in adj.all:3 adj.pert:3 adv.all:4 noun.Tops:1 noun.act:1 noun.animal:1 \
    noun.artifact:1 noun.attribute:1 noun.body:1 noun.cognition:1 noun.communication:1 \
    noun.event:1 noun.feeling:1 noun.food:1 noun.group:1 noun.location:1 noun.motive:1 \
    noun.object:1 noun.person:1 noun.phenomenon:1 noun.plant:1 noun.possession:1 \
    noun.process:1 noun.quantity:1 noun.relation:1 noun.shape:1 noun.state:1 \
    noun.substance:1 noun.time:1 verb.body:2 verb.change:2 verb.cognition:2 \
    verb.communication:2 verb.competition:2 verb.consumption:2 verb.contact:2 \
    verb.creation:2 verb.emotion:2 verb.motion:2 verb.perception:2 verb.possession:2 \
    verb.social:2 verb.stative:2 verb.weather:2 adj.ppl:3; do
    printf '%02d\t%s\t%s\n' "$n" "${entry%:*}" "${entry#*:}" >>"$lexnames"
    n=$((n + 1))
done
[ "$n" = 45 ] || { echo "setup_dialogue: lexnames has $n entries, expected 45" >&2; exit 1; }
if cmp -s "$lexnames" "$TARGET/lexnames"; then
    rm -f "$lexnames"
else
    rm -f "$TARGET/lexnames"   # a stale file or symlink
    mv "$lexnames" "$TARGET/lexnames"
    chmod 644 "$TARGET/lexnames"
fi

# check: nltk finds WordNet there and METEOR uses it (a synonym scores above no match)
NLTK_DATA="$NLTK_DIR${NLTK_DATA:+:$NLTK_DATA}" "$PYTHON" - <<'EOF'
from nltk.corpus import wordnet
from nltk.translate.meteor_score import meteor_score

assert wordnet.synsets("dog"), "WordNet has no synsets for 'dog'"
# car/auto: WordNet synonyms that are their own Porter stems (nltk looks synonyms up by stem)
synonym = meteor_score([["the", "auto", "was", "fast"]], ["the", "car", "was", "fast"])
exact_only = meteor_score([["the", "bus", "was", "fast"]], ["the", "car", "was", "fast"])
assert synonym > exact_only, (synonym, exact_only)
print(f"setup_dialogue: WordNet {wordnet.get_version()} ready; METEOR synonym check ok")
EOF
