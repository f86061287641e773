// Where the bundled default model lives.
#pragma once

#include <string>

namespace sieve::model {

// The bundled model directory under SOURCE_DIR/models (the first subdirectory with a
// config.json, by name), or "" when none is committed.
std::string bundled_model_dir(const std::string& source_dir);

}  // namespace sieve::model
