# soundfile 0.13.1 dlopens the libsndfile bundled in its wheel (_soundfile_data/), which the
# generic rule already patches; a missing libsndfile was a start-up failure (SGLang's OpenAI
# routes import soundfile), so prove here, at build time, that it loads.
{ ... }:
prev: {
  pythonImportsCheck = [ "soundfile" ];
}
