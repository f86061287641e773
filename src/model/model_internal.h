// Internal to model/: what Model::load (model.cpp) builds the model from.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/rank_layout.h"
#include "model/weights.h"

namespace sieve::model {

// group: the rank's communicator (null: no communication); side_stream, f32_partials: LoadOptions'.
std::unique_ptr<Model> make_minimax_m3(ModelConfig cfg, const RankLayout& layout, ModelWeights w, const Device& dev,
                                       ops::Collective* group, bool side_stream = true, bool f32_partials = false);

}  // namespace sieve::model
