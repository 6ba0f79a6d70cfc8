# kpa_kokkos_sources(<files>...): marks sources that include Kokkos headers so they are compiled
# the way the Kokkos installation wants (Kokkos 4.x built with
# Kokkos_ENABLE_COMPILE_AS_CMAKE_LANGUAGE compiles them as its own language, e.g. CUDA).
function(kpa_kokkos_sources)
  if(Kokkos_COMPILE_LANGUAGE)
    set_source_files_properties(${ARGN} PROPERTIES LANGUAGE ${Kokkos_COMPILE_LANGUAGE})
  endif()
endfunction()
