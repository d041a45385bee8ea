"""What autofit writes for every trainer alike, whatever the model: the placeholders of the user's
own data and SimpleTuner's environment. What a trainer runs for a model family is the family's to
declare (autofit/families/); what it calls one preset is the preset's (conf/model/). Nothing here
imports more than the standard library.
"""

from __future__ import annotations

DATA_DIR = "path/to/images"  # placeholder: autofit never sees the user's data
# SimpleTuner reads a named environment from config/<env>/ under its working directory.
SIMPLETUNER_ENV = "autofit"
